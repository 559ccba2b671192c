"""Validation during training end to end on CPU: the `tiny` GR00T model, vla-io's pipeline and the 3-episode
synthetic dataset with one episode held out (data.val_episodes=1)."""

from __future__ import annotations

import json
import logging
import math

import gr00t_model
import pytest
import torch
from gr00t_train import load_config
from gr00t_train._baselines import LeRobotStyleSource
from gr00t_train._distributed import DistEnv
from gr00t_train._parts import episode_ids
from gr00t_train.cli import main
from gr00t_train.data import dataset as _data
from gr00t_train.data.component import build_source
from gr00t_train.metrics.component import read_validation

GROUPS = {"eef_delta_pos", "eef_delta_rot", "gripper"}


def _without_seconds(validations: list[dict]) -> list[dict]:
    return [{**v, "seconds": 0.0} for v in validations]


@pytest.mark.slow
def test_validation_leaves_losses_bit_for_bit_resumes_and_infer_shows_the_baseline(
    dataset, tmp_path, train_args, losses, capsys
) -> None:
    plain, run = tmp_path / "plain", tmp_path / "run"
    sets = ("steps=4", "data.val_episodes=1", "checkpoint.every=2")
    assert main(train_args(dataset, plain, *sets, "eval.every=0")) == 0
    validated = (*sets, "eval.every=2", "eval.batches=2", "logging.plots=true")
    assert main(train_args(dataset, run, *validated)) == 0
    assert losses(run) == losses(
        plain
    )  # bit for bit: validation draws, reads and changes nothing of training

    validations = read_validation(run / "metrics.jsonl")
    assert [v["step"] for v in validations] == [2, 4]
    for v in validations:
        assert v["samples"] == 8 and set(v["groups"]) == GROUPS
        assert all(math.isfinite(v[k]) and v[k] > 0 for k in ("mse", "baseline", "ratio"))
        assert v["ratio"] == pytest.approx(v["mse"] / v["baseline"])
    summary = json.loads((run / "summary.json").read_text())
    assert summary["validation_split"] == {"held_out_episodes": [1], "train_episodes": 2}
    assert summary["validation"] == validations[-1] and summary["validation_s"] > 0
    split = json.loads((run / "checkpoints" / "step_000004" / "dataset_meta" / "split.json").read_text())
    assert split == summary["validation_split"]
    assert (run / "loss.png").stat().st_size > 0
    printed = capsys.readouterr().out
    assert "validation (step 4)" in printed and "predicting the mean" in printed

    # Resume from step 2 (after its validation): every step and validation once, step 4's scored again alike.
    step2 = run / "checkpoints" / "step_000002"
    assert main([*train_args(dataset, run, *validated), "--resume", str(step2)]) == 0
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows if "kind" not in r] == [1, 2, 3, 4]
    assert [r["step"] for r in rows if r.get("kind") == "val"] == [2, 4]
    assert _without_seconds(read_validation(run / "metrics.jsonl")) == _without_seconds(validations)

    # infer prints and writes the same baseline, on the normalized scale, beside the dataset units.
    capsys.readouterr()
    report_path = tmp_path / "eval.json"
    argv = ["infer", "--checkpoint", str(run / "checkpoints"), "--dataset", str(dataset)]
    assert (
        main([*argv, "--batches", "1", "--batch-size", "4", "--device", "cpu", "--json", str(report_path)])
        == 0
    )
    table = capsys.readouterr().out
    assert "MSE (dataset units)" in table and "mean baseline (normalized)" in table and "ratio" in table
    report = json.loads(report_path.read_text())
    assert set(report["baseline_normalized"]) == set(report["ratio"]) == set(report["baseline"]) == GROUPS
    for group in GROUPS:
        ratio = report["mse_normalized"][group] / report["baseline_normalized"][group]
        assert report["ratio"][group] == pytest.approx(ratio)
    assert report["ratio_all"] == pytest.approx(
        report["mse_normalized_all"] / report["baseline_normalized_all"]
    )


def test_a_split_that_leaves_nothing_to_train_stops_before_the_model(dataset, tmp_path, train_args, capsys):
    assert main(train_args(dataset, tmp_path / "run", "data.val_episodes=3")) == 2
    error = capsys.readouterr().err
    assert "data.val_episodes=3 holds out 3 of the dataset's 3 episode(s), leaving none to train on" in error


def test_a_fraction_of_few_episodes_says_no_validation_runs(dataset, caplog) -> None:
    cfg = load_config(preset="demo", overrides=[f"data.dataset={dataset}"])  # data.val_episodes=0.05 of 3
    with caplog.at_level(logging.INFO, logger="gr00t_train.data.dataset"):
        split = _data.plan_split(cfg, _data.plan_data(cfg))
    assert split.held_out == [] and split.train == [0, 1, 2]
    assert "rounds down to 0" in caplog.text and "--set data.val_episodes=1" in caplog.text


def test_training_reads_only_training_episodes_normalized_as_before(
    dataset_copy, tmp_path, monkeypatch
) -> None:
    """Both training loaders read the training episodes only; statistics computed from rows still come
    from every episode, so the split leaves normalization as it was."""
    monkeypatch.setenv("VLA_IO_CACHE", str(tmp_path / "cache"))
    for name in ("stats.json", "episodes_stats.jsonl"):  # no statistics of its own: computed from rows
        (dataset_copy / "meta" / name).unlink()
    overrides = [f"data.dataset={dataset_copy}", "data.val_episodes=1", "data.batch_size=4", "device=cpu"]
    cfg = load_config(preset="demo", overrides=[*overrides, "data.num_workers=0", "optimizations.data=sync"])
    plan = _data.plan_data(cfg)
    data = _data.open_dataset(
        cfg, model_horizon=16, progress=False, plan=plan, split=_data.plan_split(cfg, plan)
    )
    whole = _data.open_dataset(cfg, model_horizon=16, progress=False, plan=plan)
    assert data.dataset.episode_indices == [0, 2] and whole.dataset.episode_indices == [0, 1, 2]
    assert data.stats == whole.stats

    processor = _data.make_processor(
        data, gr00t_model.GR00TConfig.preset("tiny"), gr00t_model.load_tokenizer(None), vlm_seq_len=None
    )
    env = DistEnv(rank=0, world_size=1, local_rank=0, device=torch.device("cpu"))
    epoch = len(data.dataset) // cfg.data.batch_size
    for source in (build_source(cfg, env, data, processor), LeRobotStyleSource(cfg, data, processor, env)):
        try:
            seen = {e for _ in range(epoch) for e in episode_ids(next(source))}
        finally:
            source.close()
        assert seen == {0, 2}, type(source).__name__
