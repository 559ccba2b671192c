"""`gr00t-train train` end to end on CPU: the real vla_io pipeline, gr00t_model `tiny`, vla_overlap and
vla_graph, through the command line."""

from __future__ import annotations

import gzip
import json

import gr00t_model
import pytest
import torch
from gr00t_train.checkpoint.restore import load_pretrained
from gr00t_train.cli import main


@pytest.mark.slow
def test_train_checkpoint_and_bit_exact_resume(dataset, tmp_path, train_args, losses) -> None:
    out = tmp_path / "run"
    assert main(train_args(dataset, out, "checkpoint.every=3", "optimizations.comm=zero1_overlap")) == 0
    reference = losses(out)
    assert sorted(reference) == [1, 2, 3, 4, 5, 6] and all(0 < v < 10 for v in reference.values())
    step3 = out / "checkpoints" / "step_000003"
    final = out / "checkpoints" / "step_000006"
    # the checkpoint holds the frozen weights (random start: no base) and ZeRO-1's fp32 masters, not the
    # trainable weights: `export` writes the complete model, which gr00t_model loads alone
    assert main(["export", str(final), str(tmp_path / "export")]) == 0
    model = gr00t_model.from_pretrained(tmp_path / "export")
    assert model.config.action_horizon == 16
    assert (tmp_path / "export" / "dataset_meta" / "stats.json").is_file()
    assert json.loads((final / "train_config.json").read_text())["data"]["dataset"] == str(dataset)
    assert (final / "dataset_meta" / "stats.json").is_file()

    # Resume from step 3 (async data pipeline, RNG, optimizer, schedule): steps 4-6 repeat bit for bit.
    args = train_args(dataset, out, "checkpoint.every=3", "optimizations.comm=zero1_overlap")
    assert main([*args, "--resume", str(step3)]) == 0
    assert losses(out) == reference
    lines = (out / "metrics.jsonl").read_text().splitlines()
    assert [json.loads(x)["step"] for x in lines] == [1, 2, 3, 4, 5, 6]  # each step once: the resumed run's
    resumed, report = load_pretrained(final)
    assert report.missing == []
    for a, b in zip(model.state_dict().values(), resumed.state_dict().values()):
        assert torch.equal(a, b)


@pytest.mark.slow
def test_sync_and_async_data_and_graph_modes_agree(dataset, tmp_path, train_args, losses) -> None:
    # The ablation switches change speed, not numbers: sync vs async data, eager vs emulated graphs.
    runs = {
        "sync": ("optimizations.data=sync", "optimizations.comm=allreduce_after_backward"),
        "async-graphs": ("optimizations.graph=per_microbatch", "optimizations.comm=overlap"),
    }
    results = {}
    for name, sets in runs.items():
        out = tmp_path / name
        assert main(train_args(dataset, out, "steps=3", *sets)) == 0
        results[name] = losses(out)
    assert results["sync"] == results["async-graphs"]


def test_config_command_round_trips(tmp_path, capsys) -> None:
    assert main(["config", "--preset", "libero", "--set", "optim.lr=3e-4", "--format", "json"]) == 0
    path = tmp_path / "cfg.json"
    path.write_text(capsys.readouterr().out)
    assert main(["config", "--config", str(path), "--format", "json"]) == 0
    assert json.loads(capsys.readouterr().out)["optim"]["lr"] == 3e-4


@pytest.mark.slow
def test_demo_then_infer(dataset, tmp_path, capsys) -> None:
    out = tmp_path / "demo"
    sets = ["steps=4", "data.batch_size=4", "logging.progress=false", "device=cpu"]
    argv = ["demo", "--out", str(out), "--dataset", str(dataset)]
    for item in sets:
        argv += ["--set", item]
    assert main(argv) == 0
    printed = capsys.readouterr().out
    assert "open-loop action inference" in printed and "eef_delta_pos" in printed and "gripper" in printed
    checkpoint = out / "run" / "checkpoints" / "step_000004"
    assert f"checkpoint   {checkpoint}" in printed
    for name in ("loss.png", "step_time.png", "metrics.jsonl", "summary.json", "config.json"):
        assert (out / "run" / name).is_file(), name

    report_path = tmp_path / "eval.json"
    argv = ["infer", "--checkpoint", str(out / "run" / "checkpoints"), "--dataset", str(dataset)]
    assert main([*argv, "--batches", "2", "--batch-size", "4", "--json", str(report_path)]) == 0
    report = json.loads(report_path.read_text())
    assert report["checkpoint"] == str(checkpoint) and report["samples"] == 8
    assert set(report["mse"]) == {"eef_delta_pos", "eef_delta_rot", "gripper"}
    assert all(v >= 0 for v in report["mse"].values())
    assert set(report["mse_normalized"]) == set(report["mse"]) and 0 < report["mse_normalized_all"] < 10

    # Running the demo again starts over in the same folder (a training run there would refuse to).
    again = ["demo", "--out", str(out), "--dataset", str(dataset)]
    for item in ["steps=2", *sets[1:]]:
        again += ["--set", item]
    assert main(again) == 0
    assert sorted(p.name for p in (out / "run" / "checkpoints").iterdir()) == ["step_000002"]


def test_profile_steps_writes_kernels_and_a_timeline(dataset, tmp_path, train_args) -> None:
    """logging.profile_steps: the run trains as usual and leaves the profiler's kernel summary and a gzipped
    Chrome trace beside its metrics (on CPU the trace holds CPU ops and no GPU kernel is counted)."""
    out = tmp_path / "run"
    assert main(train_args(dataset, out, "steps=4", "logging.summary_skip=1", "logging.profile_steps=2")) == 0
    assert json.loads((out / "summary.json").read_text())["steps"] == 4
    kernels = json.loads((out / "kernels_rank0.json").read_text())
    assert kernels["total"] == 0.0 and kernels["top_kernels"] == []
    trace = json.loads(gzip.decompress((out / "trace_rank0.json.gz").read_bytes()))
    assert any(event.get("ph") == "X" for event in trace["traceEvents"])
