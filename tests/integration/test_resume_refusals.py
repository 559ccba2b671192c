"""A resume never silently changes a run: what the checkpoint recorded against what the run would use now.

Each case starts from one finished 6-step run (checkpoints at steps 3 and 6), copied, and changes one
thing. A refusal is exit 2 with one message naming the setting (or file), old and new values and the way
on, given before the model is built; the advice it gives works as written."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest
import torch
from gr00t_train.checkpoint.manifest import write_manifest
from gr00t_train.cli import main

BASE = ("checkpoint.every=3", "logging.tensorboard=false", "optim.min_lr_ratio=0.1")


@pytest.fixture(scope="module")
def finished(dataset, tmp_path_factory, train_args) -> Path:
    out = tmp_path_factory.mktemp("finished") / "run"
    assert main(train_args(dataset, out, *BASE)) == 0
    return out


@pytest.fixture
def run(finished, tmp_path) -> Path:
    """A private copy of the finished run (its checkpoints name the shared dataset)."""
    copy = tmp_path / "run"
    shutil.copytree(finished, copy)
    return copy


def _forbid_model(monkeypatch) -> None:
    """From now on, building the model fails the test: refusals come first."""

    def refuse(*args, **kwargs):
        raise AssertionError("the model was built before the refusal")

    monkeypatch.setattr("gr00t_train.model.gr00t.build_model", refuse)


@pytest.fixture
def no_model(monkeypatch):
    _forbid_model(monkeypatch)


def _resume(train_args, dataset, run: Path, *sets: str, flags: tuple[str, ...] = ()) -> int:
    step3 = run / "checkpoints" / "step_000003"
    return main([*train_args(dataset, run, *BASE, *sets), "--resume", str(step3), *flags])


def _error(capsys) -> str:
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if "gr00t-train train: error:" in line]
    assert len(lines) == 1 and "Traceback" not in err, err[-2000:]
    return lines[0]


@pytest.mark.parametrize(
    ("change", "named"),
    [
        ("data.cameras=image", "data.cameras [image,wrist_image] -> [image]"),
        ("model.action_horizon=8", "model.action_horizon 16 -> 8"),
        ("steps=9", "steps 6 -> 9"),
        ("optim.lr=1e-3", "optim.lr 0.003 -> 0.001"),
        ("model.tune_visual=true", "model.tune_visual False -> True"),
        ("model.preset=n1.6-3b", "model.preset tiny -> n1.6-3b"),
        ("data.val_episodes=1", "data.val_episodes 0.05 -> 1.0"),
    ],
)
def test_a_change_of_what_the_run_computes_is_refused_before_building(
    run, dataset, train_args, capsys, no_model, change, named
) -> None:
    assert _resume(train_args, dataset, run, change) == 2
    line = _error(capsys)
    assert named in line, line
    key, _, _ = change.partition("=")
    assert "--resume-changed KEY" in line and f"--set model.checkpoint={run / 'checkpoints'}" in line


def test_statistics_rewritten_in_place_are_refused_naming_the_file(
    run, dataset_copy, train_args, capsys, monkeypatch
) -> None:
    # the run trained on dataset_copy; then its stats.json is rewritten in place
    out = run.parent / "own"
    assert main(train_args(dataset_copy, out, *BASE)) == 0
    stats = dataset_copy / "meta" / "stats.json"
    data = json.loads(stats.read_text())
    data["action"]["std"] = [2 * v for v in data["action"]["std"]]
    stats.write_text(json.dumps(data))
    _forbid_model(monkeypatch)
    assert _resume(train_args, dataset_copy, out) == 2
    line = _error(capsys)
    assert f"{dataset_copy} is not the dataset" in line and "1 file changed (meta/stats.json)" in line


def test_a_dataset_grown_in_place_is_refused_naming_the_new_files(
    run, dataset_copy, train_args, capsys, monkeypatch
) -> None:
    out = run.parent / "own"
    assert main(train_args(dataset_copy, out, *BASE)) == 0
    videos = sorted(dataset_copy.glob("videos/**/*.mp4"))
    shutil.copy(videos[0], videos[0].with_name("episode_000099.mp4"))
    _forbid_model(monkeypatch)
    assert _resume(train_args, dataset_copy, out) == 2
    assert "1 file added (videos/" in _error(capsys)


def test_a_checkpoint_that_unpickles_code_is_refused_without_torchs_advice(
    run, dataset, train_args, capsys, no_model
) -> None:
    step3 = run / "checkpoints" / "step_000003"

    class Payload:  # pickles as a call of os.system
        def __reduce__(self):
            import os

            return (os.system, ("true",))

    torch.save({"state": Payload()}, step3 / "optimizer.pt")
    (step3 / "manifest.json").unlink()
    write_manifest(
        step3, {"step": 3, "run_id": json.loads((step3 / "trainer_state.json").read_text())["run_id"]}
    )
    assert _resume(train_args, dataset, run) == 2
    line = _error(capsys)
    assert "optimizer.pt names" in line and "refused, since loading it could run code" in line
    assert "weights_only" not in line


def test_harmless_changes_resume_and_continue_the_trajectory(run, dataset, train_args, losses) -> None:
    reference = losses(run)
    sets = ("logging.every=2", "checkpoint.every=2", "checkpoint.keep_last=5", "eval.every=0",
            "memory.recompute=[dit,llm]", "memory.recompute_policy=selective")  # fmt: skip
    assert _resume(train_args, dataset, run, *sets) == 0
    assert losses(run) == reference  # steps 4-6 again, bit for bit


def test_an_allowed_change_is_recorded(run, dataset, train_args) -> None:
    assert _resume(train_args, dataset, run, "optim.lr=1e-3", flags=("--resume-changed", "optim.lr")) == 0
    record = [{"step": 3, "key": "optim.lr", "from": 0.003, "to": 0.001}]
    final = run / "checkpoints" / "step_000006"
    assert json.loads((final / "trainer_state.json").read_text())["resume_changes"] == record
    assert json.loads((run / "summary.json").read_text())["resume_changes"] == record
    lrs = {
        json.loads(x)["step"]: json.loads(x)["lr"] for x in (run / "metrics.jsonl").read_text().splitlines()
    }
    assert lrs[4] < 1e-3  # the schedule goes on from step 3 with the new peak, no restart of the warmup


def test_more_steps_continue_the_recorded_schedule_at_its_final_lr(run, dataset, train_args) -> None:
    assert _resume(train_args, dataset, run, "steps=8", flags=("--resume-changed", "steps")) == 0
    lrs = {
        json.loads(x)["step"]: json.loads(x)["lr"] for x in (run / "metrics.jsonl").read_text().splitlines()
    }
    assert sorted(lrs) == list(range(1, 9))
    final = 0.003 * 0.1  # the demo's peak lr x optim.min_lr_ratio: where the 6-step schedule ends
    assert lrs[7] == pytest.approx(final) and lrs[8] == pytest.approx(final)
    assert lrs[4] > lrs[5] > lrs[6] >= final  # steps 4-6 as the original schedule had them


def test_more_steps_after_a_schedule_that_ends_at_zero_are_refused(
    dataset, tmp_path, train_args, capsys
) -> None:
    out = tmp_path / "zero"
    assert main(train_args(dataset, out, "checkpoint.every=3", "optim.min_lr_ratio=0")) == 0
    step6 = out / "checkpoints" / "step_000006"
    argv = [*train_args(dataset, out, "optim.min_lr_ratio=0", "steps=9"), "--resume", str(step6)]
    assert main([*argv, "--resume-changed", "steps"]) == 2
    assert "ends at step 6 with lr 0" in _error(capsys)


def test_an_unknown_resume_changed_key_is_refused(run, dataset, train_args, capsys) -> None:
    assert _resume(train_args, dataset, run, flags=("--resume-changed", "optim.lrr")) == 2
    assert "checkpoint.resume_changed: optim.lrr: not a setting" in _error(capsys)


def test_the_advice_of_a_refusal_works_as_written(run, dataset, train_args, capsys) -> None:
    assert _resume(train_args, dataset, run, "data.cameras=image") == 2
    advice = _error(capsys).split("drop --resume and add ", 1)[1]
    sets = re.findall(r"--set (\S+)", advice)
    assert [s.split("=")[0] for s in sets] == ["model.checkpoint", "output_dir"]
    argv = train_args(dataset, run, *BASE, "data.cameras=image")
    for item in sets:
        argv += ["--set", item]
    assert main(argv) == 0  # a new run from the checkpoint's weights, in its own folder
    new = Path(sets[1].split("=", 1)[1])
    summary = json.loads((new / "summary.json").read_text())
    assert summary["initial_weights"] == str(run / "checkpoints" / "step_000003")


def test_new_run_refuses_to_move_away_the_checkpoint_it_starts_from(run, dataset, train_args, capsys) -> None:
    step3 = run / "checkpoints" / "step_000003"
    argv = train_args(dataset, run, *BASE, f"model.checkpoint={step3}")
    assert main([*argv, "--new-run"]) == 2
    line = _error(capsys)
    assert "model.checkpoint: " in line and "would be gone before this run loads it" in line
    assert step3.is_dir()  # nothing was moved
