"""Processes under torchrun for the tests of multi-rank paths on CPU (gloo)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys


def torchrun(*args: str, nproc: int = 2, timeout: float = 240) -> tuple[int, str]:
    """`python -m torch.distributed.run --standalone --nproc_per_node nproc *args` with one thread per process:
    (exit code, output). Past `timeout` the launcher and its workers are killed and the test fails with the
    output's tail."""
    # --standalone: torchrun binds a free port itself (probing one first races with other jobs)
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc_per_node",
        str(nproc),
        *args,
    ]
    proc = subprocess.Popen(cmd, env={**os.environ, "OMP_NUM_THREADS": "1"}, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, start_new_session=True)  # fmt: skip
    try:
        output, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)  # the workers too, not only the launcher
        output, _ = proc.communicate()
        raise AssertionError("torchrun timed out:\n" + output[-3000:]) from None
    return proc.returncode, output
