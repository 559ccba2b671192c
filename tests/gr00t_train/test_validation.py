"""Validation during training, on the stand-ins and by hand: the held-out split, the mean-action baseline's
arithmetic, a loop that validates with the same losses bit for bit as one that does not, the records in
metrics.jsonl / TensorBoard / summary.json / loss.png, a resume after a validation, and two ranks."""

from __future__ import annotations

import json
import math
import textwrap
from pathlib import Path

import gr00t_model
import gr00t_train
import pytest
import torch
from _torchrun import torchrun
from gr00t_train import DataError
from gr00t_train.metrics.component import read_history, read_validation
from gr00t_train.validation.held_out import (
    ActionErrors,
    HeldOut,
    action_columns,
    describe_split,
    held_out_count,
    mean_action,
    split_episodes,
)

STANDINS = Path(__file__).with_name("standins.py")


# ------------------------------------------------------------------------------------------------ split
def test_split_is_deterministic_disjoint_and_evenly_spread() -> None:
    episodes = [3, 7, 8, 20, 21, 22, 30, 31, 40, 41, 50, 60, 61, 62, 70, 80, 81, 90, 95, 99]
    split = split_episodes(episodes, 4)
    assert split == split_episodes(list(reversed(episodes)), 4)  # the order given does not matter
    assert split.held_out == [8, 31, 61, 90]  # the middle of each quarter of the sorted order
    assert not set(split.held_out) & set(split.train)
    assert sorted(split.held_out + split.train) == episodes
    positions = [episodes.index(e) for e in split.held_out]
    assert {b - a for a, b in zip(positions, positions[1:])} == {5}  # evenly spread

    spread = split_episodes(range(100), 0.1).held_out
    assert spread == [5, 15, 25, 35, 45, 55, 65, 75, 85, 95]


def test_fraction_rounds_down_and_zero_is_said_once() -> None:
    assert held_out_count(0.05, 3) == 0
    assert held_out_count(0.05, 40) == 2
    assert held_out_count(0.29, 100) == 29  # 0.29 * 100 is 28.999... in floating point
    assert held_out_count(3, 10) == 3
    none = split_episodes(range(3), 0.05)
    assert none.held_out == [] and none.train == [0, 1, 2]
    line = describe_split(none, 0.05, validates=True)
    assert "rounds down to 0" in line and "--set data.val_episodes=1" in line
    line = describe_split(split_episodes(range(3), 1), 1, validates=False)
    assert "holding out 1 of 3 episodes" in line and "[1]" in line and "eval.every=0" in line


@pytest.mark.parametrize("setting", [3, 5])
def test_split_that_leaves_nothing_to_train_on_is_refused(setting) -> None:
    with pytest.raises(DataError) as info:
        split_episodes(range(3), setting)
    assert "data.val_episodes" in str(info.value) and "leaving none to train on" in str(info.value)


# --------------------------------------------------------------------------------------------- baseline
def _spec(mean_for_arm=(1.0, 0.0)) -> gr00t_model.EmbodimentSpec:
    """An arm of 2 min/max joints (range [0, 4] and [-2, 2]) and a mean/std gripper."""
    arm_stats = {"min": [0.0, -2.0], "max": [4.0, 2.0]}
    if mean_for_arm is not None:
        arm_stats["mean"] = list(mean_for_arm)
    return gr00t_model.EmbodimentSpec(
        tag="new_embodiment",
        state=[gr00t_model.JointGroup(name="s", start=0, end=1, stats={"min": [0.0], "max": [1.0]})],
        action=[
            gr00t_model.JointGroup(name="arm", start=0, end=2, stats=arm_stats),
            gr00t_model.JointGroup(
                name="grip", start=2, end=3, mode="mean_std", stats={"mean": [0.5], "std": [0.25]}
            ),
        ],
        action_horizon=3,
    )


def test_mean_baseline_on_the_normalized_scale_by_hand() -> None:
    spec = _spec()
    # min/max: 2 (mean - min) / (max - min) - 1 -> [2*1/4 - 1, 2*2/4 - 1] = [-0.5, 0]; mean/std: 0
    assert mean_action(spec, 3).tolist() == [[-0.5, 0.0, 0.0]] * 3
    assert action_columns(spec) == [("arm", 0, 2), ("grip", 2, 1)]

    # One sample, 3 steps (the last past the episode's end), 4 action dims (the last one padding).
    target = torch.tensor([[[0.5, 0.0, 1.0, 0.0], [-0.5, 1.0, -1.0, 0.0], [9.0, 9.0, 9.0, 0.0]]])
    predicted = torch.tensor([[[0.5, 1.0, 0.0, 50.0], [-1.5, 1.0, -1.0, 50.0], [99.0, 99.0, 99.0, 50.0]]])
    real_steps = torch.tensor([[True, True, False]])
    errors = ActionErrors(action_columns(spec))
    errors.add(predicted, target, mean_action(spec, 3), real_steps)
    scores = errors.scores()
    # arm, model: step 0 (0, 1) -> 1, step 1 (1, 0) -> 1: 2 / 4 entries; the mean: step 0 (1, 0), step 1 (0, 1)
    assert scores["groups"]["arm"] == {"mse": 0.5, "baseline": 0.5, "ratio": 1.0}
    # grip, model: step 0 1, step 1 0 -> 1 / 2; the mean (0): 1 + 1 -> 2 / 2
    assert scores["groups"]["grip"] == {"mse": 0.5, "baseline": 1.0, "ratio": 0.5}
    assert scores["mse"] == pytest.approx(3 / 6) and scores["baseline"] == pytest.approx(4 / 6)
    assert scores["ratio"] == pytest.approx(0.75) and scores["samples"] == 1

    # An action_mask (1 on the real entries, as the processor and loss have it) counts the same entries.
    mask = torch.zeros(1, 3, 4)
    mask[:, :2, :3] = 1
    by_mask = ActionErrors(action_columns(spec))
    by_mask.add(predicted, target, mean_action(spec, 3), mask)
    assert by_mask.scores() == scores


def test_baseline_without_a_mean_statistic_is_nan_not_an_error() -> None:
    spec = _spec(mean_for_arm=None)
    errors = ActionErrors(action_columns(spec))
    errors.add(
        torch.zeros(1, 3, 3), torch.ones(1, 3, 3), mean_action(spec, 3), torch.ones(1, 3, dtype=torch.bool)
    )
    arm = errors.scores()["groups"]["arm"]
    assert arm["mse"] == 1.0 and math.isnan(arm["baseline"]) and math.isnan(arm["ratio"])
    assert errors.scores()["groups"]["grip"]["baseline"] == 1.0  # the gripper's mean still counts


# ----------------------------------------------------------------------------------------- in the loop
def standin_held_out(batches: int = 3, rank: int = 0, world_size: int = 1) -> HeldOut:
    """Held-out samples for the stand-in regressor: chunks of one step of its 4 outputs. Its predict draws
    from the global stream and runs dropout when left in train mode: validation must isolate both."""
    g = torch.Generator().manual_seed(7)
    true_w = torch.randn(8, 4, generator=torch.Generator().manual_seed(1234))
    every = []
    for _ in range(batches):
        x = torch.randn(4, 8, generator=g)
        every.append({"x": x, "action": (x @ true_w)[:, None, :], "action_mask": torch.ones(4, 1, 4)})
    ids = list(range(rank, batches, world_size))

    def predict(model, batch, noise):
        jitter = 0.0 * torch.randn(1)  # a model that draws its own noise from the global stream
        return model(batch["x"] + 0.0 * noise[:, 0, :8])[:, None, :] + jitter

    return HeldOut(
        batches=[every[i] for i in ids],
        ids=ids,
        columns=[("first", 0, 1), ("rest", 1, 3)],
        baseline=torch.zeros(1, 4),
        predict=predict,
        noise_shape=(1, 8),
        seed=0,
        episodes=[99],
    )


class _Board:
    """A TensorBoard writer stand-in that keeps the scalars."""

    def __init__(self) -> None:
        self.scalars: dict[str, list[tuple[int, float]]] = {}

    def add_scalar(self, tag, value, step) -> None:
        self.scalars.setdefault(tag, []).append((step, value))

    def close(self) -> None:
        pass


def _fit(standins, env, out: Path, every: int, **overrides):
    parts = standins.make_parts()
    parts.validation = standin_held_out()
    cfg = standins.small_config(out, steps=8, eval__every=every, **overrides)
    trainer = gr00t_train.Trainer(cfg, parts, env)
    return trainer, trainer.fit(), parts


def test_validation_changes_no_loss_and_is_recorded(tmp_path, env, standins, monkeypatch) -> None:
    boards = []
    monkeypatch.setattr(
        "gr00t_train.metrics.records._tensorboard_writer", lambda path: boards.append(_Board()) or boards[-1]
    )
    _, _, plain = _fit(standins, env, tmp_path / "a", every=0)
    trainer, summary, parts = _fit(standins, env, tmp_path / "b", every=3, logging__plots="true")

    a, b = (read_history(tmp_path / name / "run" / "metrics.jsonl") for name in ("a", "b"))
    assert [(r.loss, r.grad_norm) for r in a] == [(r.loss, r.grad_norm) for r in b]  # bit for bit
    for p, q in zip(plain.model.parameters(), parts.model.parameters()):
        assert torch.equal(p, q)
    assert parts.model.training and parts.model.net[2].training  # back in train mode (dropout on)
    assert read_validation(tmp_path / "a" / "run" / "metrics.jsonl") == []

    run = tmp_path / "b" / "run"
    validations = read_validation(run / "metrics.jsonl")
    assert [v["step"] for v in validations] == [3, 6, 8]  # every eval.every steps and after the last
    assert all(v["samples"] == 12 and set(v["groups"]) == {"first", "rest"} for v in validations)
    assert validations[0]["mse"] != validations[-1]["mse"]  # the weights changed between them
    assert validations == trainer.metrics.validations
    written = json.loads((run / "summary.json").read_text())
    assert written["validation"] == validations[-1] and written["validation_s"] > 0
    assert 0 < written["validation_share"] < 1
    assert "validation (step 8)" in summary.table() and "predicting the mean" in summary.table()
    assert (run / "loss.png").stat().st_size > 0
    board = boards[-1].scalars
    assert [step for step, _ in board["val/ratio"]] == [3, 6, 8]
    assert {"val/mse", "val/baseline", "val/first/mse", "val/rest/ratio"} <= set(board)


def test_a_resume_after_a_validation_keeps_metrics_consistent(tmp_path, env, standins) -> None:
    _fit(standins, env, tmp_path / "once", every=3)
    once = read_validation(tmp_path / "once" / "run" / "metrics.jsonl")
    sets = {"checkpoint__every": 4}
    _fit(standins, env, tmp_path / "twice", every=3, **sets)
    step4 = tmp_path / "twice" / "run" / "checkpoints" / "step_000004"
    _fit(standins, env, tmp_path / "twice", every=3, checkpoint__resume=str(step4), **sets)

    metrics = tmp_path / "twice" / "run" / "metrics.jsonl"
    rows = [json.loads(line) for line in metrics.read_text().splitlines()]
    assert [r["step"] for r in rows if "kind" not in r] == list(range(1, 9))  # each step once
    assert [r["step"] for r in rows if r.get("kind") == "val"] == [3, 6, 8]  # each validation once
    again = read_validation(metrics)
    assert [{**v, "seconds": 0} for v in again] == [{**v, "seconds": 0} for v in once]


# ------------------------------------------------------------------------------------------- two ranks
_WORKER = """
import importlib.util, json, sys
from pathlib import Path
import torch
sys.path[:0] = [{tests!r}, str(Path({tests!r}).parent)]  # this module and tests/_torchrun.py
spec = importlib.util.spec_from_file_location("gr00t_train_standins", {standins!r})
standins = importlib.util.module_from_spec(spec); sys.modules[spec.name] = standins; spec.loader.exec_module(standins)
from test_validation import standin_held_out
import gr00t_train
torch.set_num_threads(1)
env = gr00t_train.init_distributed("cpu")
for every in (0, 3):
    out = Path({tmp!r}) / f"every{{every}}"
    cfg = standins.small_config(out, steps=6, logging__every=2, optimizations__comm="zero1_overlap", eval__every=every)
    parts = standins.make_parts(rank=env.rank)
    parts.validation = standin_held_out(batches=3, rank=env.rank, world_size=env.world_size)
    trainer = gr00t_train.Trainer(cfg, parts, env)
    trainer.fit()
    (out / f"val-rank{{env.rank}}.json").write_text(json.dumps(trainer.metrics.validations))
gr00t_train.shutdown_distributed(env)
"""


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_two_ranks_validate_together_without_changing_the_run(tmp_path, env, standins) -> None:
    script = tmp_path / "worker.py"
    source = _WORKER.format(tests=str(STANDINS.parent), standins=str(STANDINS), tmp=str(tmp_path))
    script.write_text(textwrap.dedent(source))
    code, output = torchrun(str(script), timeout=200)
    assert code == 0, output[-5000:]
    plain, validated = (read_history(tmp_path / f"every{e}" / "run" / "metrics.jsonl") for e in (0, 3))
    assert [r.loss for r in plain] == [r.loss for r in validated]
    ranks = [json.loads((tmp_path / "every3" / f"val-rank{r}.json").read_text()) for r in (0, 1)]
    strip = [[{**v, "seconds": 0} for v in rank] for rank in ranks]
    assert strip[0] == strip[1]  # the all-reduced sums: the same scores on both ranks
    assert [v["step"] for v in ranks[0]] == [3, 6] and all(v["samples"] == 12 for v in ranks[0])
    assert read_validation(tmp_path / "every3" / "run" / "metrics.jsonl") == ranks[0]
