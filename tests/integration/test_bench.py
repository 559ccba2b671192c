"""The benchmark commands on the CPU with the tiny model, so a GPU session does not find them broken:
`gr00t-train bench` (the baseline row runs `--baseline-runs` times, in folders of its own, and the run of
median samples/s is the one the speedups divide by: the baseline is host-bound and varies between runs far
more than the graphed rows), benchmarks/train_scaling.py, benchmarks/grad_reduce_parity.py,
benchmarks/zero1_graph_probe.py (gloo) and benchmarks/step_variants.py."""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

import pytest
from gr00t_train.cli import main


@pytest.mark.timeout(600)
def test_the_baseline_row_runs_several_times_and_its_median_counts(
    dataset, tmp_path, capsys, monkeypatch
) -> None:
    import gr00t_train._backends

    asked = []  # the process-wide cuBLAS workspace is asked for up front by the last row (torch 2.11)
    monkeypatch.setattr(
        gr00t_train._backends, "request_zero_gemm_workspace", lambda cfg: asked.append(cfg) or (lambda: None)
    )
    out = tmp_path / "bench.json"
    argv = ["bench", "--preset", "libero", "--steps", "2", "--warmup", "1", "--rows", "0,1",
            "--baseline-runs", "3", "--json", str(out)]  # fmt: skip
    for item in (f"data.dataset={dataset}", "model.preset=tiny", "device=cpu", "data.batch_size=2",
                 "data.num_workers=1", f"output_dir={tmp_path / 'rows'}", "logging.progress=false"):  # fmt: skip
        argv += ["--set", item]
    assert main(argv) == 0
    rows = json.loads(out.read_text())["rows"]
    assert [r["row"] for r in rows] == ["baseline (LeRobot-style)", "+ vla-io pipeline"]
    runs = rows[0]["samples_per_s_runs"]
    assert len(runs) == 3 and rows[0]["samples_per_s"] == statistics.median(runs)
    assert "samples_per_s_runs" not in rows[1]
    assert rows[1]["speedup"] == pytest.approx(rows[1]["samples_per_s"] / statistics.median(runs))
    assert {p.name for p in (tmp_path / "rows").iterdir()} >= {"row0", "row0-run2", "row0-run3", "row1"}
    assert "median of 3 runs" in capsys.readouterr().out
    assert asked[0].output_dir == str(tmp_path / "rows" / "row1")  # up front, before any row ran


def test_baseline_runs_must_be_positive(dataset, tmp_path, capsys) -> None:
    argv = ["bench", "--preset", "libero", "--baseline-runs", "0", "--set", f"data.dataset={dataset}",
            "--set", f"output_dir={tmp_path}"]  # fmt: skip
    assert main(argv) == 2
    assert "--baseline-runs: must be >= 1, got 0" in capsys.readouterr().err


@pytest.mark.timeout(600)
def test_train_scaling_runs_one_command_per_world_size(dataset, tmp_path, monkeypatch) -> None:
    """benchmarks/train_scaling.py on the CPU (gloo) at world sizes 1 and 2: a row per world size from the
    runs' own summaries, scaling and exposed communication relative to the first row."""
    out = tmp_path / "scaling.json"
    argv = ["--dataset", str(dataset), "--nproc", "1,2", "--steps", "2", "--warmup", "1", "--workers", "1",
            "--out", str(tmp_path / "runs"), "--json", str(out), "--set", "device=cpu",
            "--set", "model.preset=tiny", "--set", "data.batch_size=2"]  # fmt: skip
    assert _load("train_scaling").main(argv) == 0
    rows = json.loads(out.read_text())["rows"]
    assert [r["world_size"] for r in rows] == [1, 2]
    first, second = rows
    assert "scaling" not in first and second["scaling"] == pytest.approx(
        second["samples_per_s"] / first["samples_per_s"]
    )
    assert second["exposed_comm_ms"] == pytest.approx(second["step_ms"] - first["step_ms"])
    assert second["samples_per_s_per_gpu"] == pytest.approx(second["samples_per_s"] / 2)
    assert all(r["samples_per_s"] > 0 and r["optimizer_ms"] > 0 for r in rows)


def _load(name: str):
    import importlib.util
    from pathlib import Path

    folder = Path(__file__).parents[2] / "benchmarks"
    if str(folder) not in sys.path:  # the scripts import their shared helper (_train_runs) as a sibling
        sys.path.insert(0, str(folder))
    path = folder / f"{name}.py"
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.timeout(600)
def test_grad_reduce_parity_compares_bf16_with_two_fp32_runs(dataset, tmp_path) -> None:
    """benchmarks/grad_reduce_parity.py on the CPU at 2 ranks: two fp32 runs agree exactly (CPU kernels are
    deterministic in a run), the bf16 reduction changes the losses after the first update, a little."""
    out = tmp_path / "parity.json"
    argv = ["--dataset", str(dataset), "--nproc", "2", "--steps", "3", "--workers", "1",
            "--out", str(tmp_path / "runs"), "--json", str(out), "--set", "device=cpu",
            "--set", "model.preset=tiny", "--set", "data.batch_size=2"]  # fmt: skip
    assert _load("grad_reduce_parity").main(argv) == 0
    report = json.loads(out.read_text())
    assert report["fp32_vs_fp32"]["steps"] == 3 and report["fp32_vs_fp32"]["max_rel_diff"] == 0.0
    assert 0.0 < report["bf16_vs_fp32"]["max_rel_diff"] < 1e-2
    assert [run["grad_reduce_dtype"] for run in report["runs"].values()] == ["float32", "float32", "bfloat16"]


@pytest.mark.timeout(300)
def test_zero1_graph_probe_runs_every_variant_on_cpu() -> None:
    """benchmarks/zero1_graph_probe.py with gloo and emulated graphs: every variant and combination runs and
    matches eager (nothing can race on the CPU), so a GPU session finds the probe working."""
    probe = Path(__file__).resolve().parents[2] / "benchmarks" / "zero1_graph_probe.py"
    variants = "zero1,overlap,zero1-all-reduce,zero1-no-side-stream,zero1-grads-exposed,zero1-synced"
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2", str(probe),
               "--device", "cpu", "--reps", "1", "--variants", variants]  # fmt: skip
    done = subprocess.run(
        command, env={**os.environ, "OMP_NUM_THREADS": "1"}, capture_output=True, text=True, timeout=240
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    lines = [line for line in done.stdout.splitlines() if line.endswith("differ")]
    assert len(lines) == 6 * 5 and all(line.endswith(": 0 of 1 differ") for line in lines), done.stdout


@pytest.mark.timeout(300)
def test_step_variants_runs_a_row_and_a_parity_row_on_cpu(tmp_path) -> None:
    """benchmarks/step_variants.py with the tiny model on the CPU (graphs emulated, nothing compiled): a row
    and a `parity=ROW` row, so a GPU session finds the side-by-side script working. In its own process: it
    sets TF32 globally, as a benchmark may."""
    script = Path(__file__).resolve().parents[2] / "benchmarks" / "step_variants.py"
    out = tmp_path / "variants.json"
    command = [sys.executable, str(script), "--device", "cpu", "--preset", "tiny", "--batch", "2",
               "--rows", "ours-graphs,parity=ours-graphs", "--steps", "2", "--warmup", "1", "--parity", "3",
               "--json", str(out)]  # fmt: skip
    done = subprocess.run(
        command, cwd=tmp_path, env={**os.environ, "OMP_NUM_THREADS": "1"}, capture_output=True, text=True,
        timeout=240,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    result = json.loads(out.read_text())
    assert "errors" not in result, result["errors"]
    (row,) = result["rows"]
    assert row["row"] == "ours-graphs" and row["samples_per_s"] > 0 and len(row["losses"]) == 3
    parity = result["parity_ours-graphs"]
    assert parity["steps"] == 3 and parity["max_rel_diff"] >= parity["mean_rel_diff"] >= 0
    assert parity["max_rel_diff"] < 1e-3  # the same fp32 arithmetic on the CPU, eager vs emulated graphs
