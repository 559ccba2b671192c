"""Issue 14's checks on a GPU (run on the H200): TF32 switches restored after a CUDA run, NaN samples named
under CUDA graphs, SIGTERM saving a checkpoint of a CUDA run."""

from __future__ import annotations

import gc
import os
import re
import signal
import subprocess
import sys
import time

import pytest
import torch
from gr00t_train.cli import main

pytestmark = pytest.mark.gpu


def _cuda(argv: list[str], *sets: str) -> list[str]:
    for item in ("device=cuda", *sets):
        argv = [*argv, "--set", item]
    return argv


def test_a_cuda_run_restores_tf32_and_names_nan_samples(
    nan_actions_copy, tmp_path, train_args, capsys
) -> None:
    # NaN actions are caught on the host, before normalization and before any graph replays them (exit 2,
    # naming episode and frame); the run's TF32 and cuDNN switches are undone on the way out.
    before = (torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.benchmark)
    argv = _cuda(
        train_args(nan_actions_copy, tmp_path / "run"),
        "steps=12",
        "optimizations.tf32=true",
        "optimizations.cudnn_benchmark=true",
        "optimizations.graph=per_microbatch",
        "optimizations.comm=overlap",
    )
    code = main(argv)
    err = capsys.readouterr().err
    assert code == 2 and "holds NaN/inf raw values" in err, (code, err[-3000:])
    named = re.findall(r"episode (\d+), frame (\d+): action\[\d+\] is nan", err)
    assert named and {episode for episode, _ in named} == {"1"}
    assert (torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.benchmark) == before


@pytest.mark.timeout(300)
def test_sigterm_saves_a_checkpoint_of_a_cuda_run(dataset, tmp_path, train_args) -> None:
    out = tmp_path / "run"
    argv = _cuda(train_args(dataset, out, "steps=100000", "logging.every=5"))
    # The child starts as from a shell: nothing this suite's process put in its environment (tests/vla_graph
    # sets CUBLAS_WORKSPACE_CONFIG when collected), and the device memory this process cached is given back.
    env = {k: v for k, v in os.environ.items() if k != "CUBLAS_WORKSPACE_CONFIG"}
    gc.collect()
    torch.cuda.empty_cache()
    log = tmp_path / "stderr.txt"  # a file, not a pipe: a child that logs a lot never blocks on a full pipe
    with log.open("w") as stderr:
        proc = subprocess.Popen([sys.executable, "-m", "gr00t_train", *argv], stderr=stderr, env=env,
                                stdout=subprocess.DEVNULL, text=True, start_new_session=True)  # fmt: skip
    try:
        deadline = time.monotonic() + 240
        while not (out / "metrics.jsonl").is_file() or not (out / "metrics.jsonl").read_text():
            alive, early = proc.poll() is None, time.monotonic() < deadline
            assert alive and early, f"training did not start (exit {proc.poll()}): {log.read_text()[-3000:]}"
            time.sleep(0.2)
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=120)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    err = log.read_text()
    assert proc.returncode == 128 + signal.SIGTERM, (proc.returncode, err[-3000:])
    match = re.search(r"stopped by SIGTERM at step (\d+): saved checkpoint (\S+);", err)
    saved = match and (out / "checkpoints" / f"step_{int(match.group(1)):06d}" / "manifest.json").is_file()
    assert saved, err[-3000:]
