"""CUDA graphs holding the gradient collectives (vla_graph sync_in_graph), all-reduce or ZeRO-1's reduce-scatter,
launched from the last backward or after it, in both graph modes, train bitwise like the eager overlap loop: on
CPU (emulated graphs, gloo), one GPU and every GPU (NCCL)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).with_name("_graph_overlap_check.py")


def _torchrun(nproc: int, device: str) -> list[str]:
    """The check's verdict lines (one per comm mode x graph mode x launcher) after asserting their number and
    that plain overlap matches eager bit for bit; the ZeRO-1 lines are left to the caller."""
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(nproc),
               str(SCRIPT), device]  # fmt: skip
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=300)
    # rank 0 prints every verdict; other ranks only their differences
    lines = [line for line in done.stdout.splitlines() if "vs eager" in line and line.startswith("rank 0 ")]
    assert len(lines) == 8, done.stdout[-3000:] + done.stderr[-3000:]  # 2 comm x 2 graph modes x 2 launchers
    plain = [line for line in lines if " overlap " in line]
    assert len(plain) == 4 and all(line.endswith("bitwise equal") for line in plain), done.stdout
    if all(line.endswith("bitwise equal") for line in lines):
        assert done.returncode == 0 and done.stdout.rstrip().endswith("OK"), done.stdout + done.stderr[-3000:]
    return lines


def _all_equal(lines: list[str]) -> None:
    different = [line for line in lines if not line.endswith("bitwise equal")]
    assert not different, "\n".join(different)


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_two_cpu_ranks_with_emulated_graphs() -> None:
    _all_equal(_torchrun(2, "cpu"))


@pytest.mark.gpu
@pytest.mark.timeout(300)
def test_one_gpu_with_nccl_in_real_graphs() -> None:
    _all_equal(_torchrun(1, "cuda"))


@pytest.mark.gpu
@pytest.mark.multigpu
@pytest.mark.timeout(300)
def test_every_gpu_of_this_host_with_nccl_in_real_graphs() -> None:
    import torch

    lines = _torchrun(torch.cuda.device_count(), "cuda")
    different = [line for line in lines if not line.endswith("bitwise equal")]
    if different:
        # Open (issue 16, BENCHMARKS.md): at 2 GPUs, ZeRO-1 with its sync captured now and then differs from
        # eager (benchmarks/zero1_graph_probe.py counts how often); plain overlap never has.
        pytest.xfail(
            "known, intermittent: ZeRO-1 in graphs at >1 GPU differs from eager:\n" + "\n".join(different)
        )
