"""CUDA graphs holding the gradient collectives (vla_graph sync_in_graph + vla_overlap launch_in_backward)
train bitwise like the eager overlap loop: on CPU (emulated graphs, gloo), one GPU and every GPU (NCCL)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).with_name("_graph_overlap_check.py")


def _torchrun(nproc: int, device: str) -> str:
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(nproc),
               str(SCRIPT), device]  # fmt: skip
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    lines = [line for line in done.stdout.splitlines() if "vs eager" in line]
    assert len(lines) == 3 and all(line.endswith("bitwise equal") for line in lines), done.stdout
    assert done.stdout.rstrip().endswith("OK"), done.stdout
    return done.stdout


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_two_cpu_ranks_with_emulated_graphs() -> None:
    _torchrun(2, "cpu")


@pytest.mark.gpu
@pytest.mark.timeout(300)
def test_one_gpu_with_nccl_in_real_graphs() -> None:
    _torchrun(1, "cuda")


@pytest.mark.gpu
@pytest.mark.multigpu
@pytest.mark.timeout(300)
def test_every_gpu_of_this_host_with_nccl_in_real_graphs() -> None:
    import torch

    _torchrun(torch.cuda.device_count(), "cuda")
