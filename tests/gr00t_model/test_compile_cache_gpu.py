"""A second process reuses the first one's compiled blocks on the GPU (multi-kernel reductions and Triton's
static launcher included): benchmarks/probes/compile_cache_probe.py, tiny preset, exits 1 on any miss."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch

pytestmark = pytest.mark.gpu

PROBE = Path(__file__).resolve().parents[2] / "benchmarks" / "probes" / "compile_cache_probe.py"


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_second_process_hits_the_compile_caches(tmp_path) -> None:
    done = subprocess.run(
        [sys.executable, str(PROBE), "--device", "cuda", "--cache-dir", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "caches: yes" in done.stdout
