"""benchmarks/prefix_cache.py runs on the CPU with the tiny model, so a GPU session finds it working."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_the_benchmark_reports_both_runs_the_cache_and_the_speed_up(tmp_path) -> None:
    script = Path(__file__).resolve().parents[2] / "benchmarks" / "prefix_cache.py"
    out = tmp_path / "report.json"
    command = [sys.executable, str(script), "--synthetic-size", "tiny", "--variants", "full,cached",
               "--steps", "3", "--warmup", "1", "--out", str(tmp_path), "--json", str(out),
               "--set", "model.preset=tiny", "--set", "device=cpu", "--set", "data.batch_size=4",
               "--set", "data.num_workers=1"]  # fmt: skip
    done = subprocess.run(
        command, env={**os.environ, "OMP_NUM_THREADS": "1"}, capture_output=True, text=True, timeout=280
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    report = json.loads(out.read_text())
    full, cached = report["results"]
    assert full["variant"] == "full" and full["cache_bytes"] is None
    assert cached["cache_bytes"] > 0 and cached["cache_build_s"] > 0 and cached["cache_samples"] > 0
    assert report["speedup"]["release"] == pytest.approx(cached["samples_per_s"] / full["samples_per_s"])
    assert "speed-up release" in done.stdout
