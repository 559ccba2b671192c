"""Run folders: a fresh run never takes over (or prunes) another run's checkpoints; --new-run keeps them,
--overwrite deletes them; pruning and clean-up touch only the current run's files."""

from __future__ import annotations

import json
import shutil

import gr00t_train
import pytest
import torch
from gr00t_train import Checkpointer, RunFolderError, Trainer
from gr00t_train.cli import build_parser


def _run(standins, env, tmp_path, **overrides) -> Trainer:
    cfg = standins.small_config(tmp_path, **overrides)
    trainer = Trainer(cfg, standins.make_parts(), env)
    trainer.fit()
    return trainer


def _run_id(folder) -> str:
    return json.loads((folder / "run.json").read_text())["run_id"]


def _names(folder) -> list[str]:
    return sorted(p.name for p in folder.iterdir())


def test_a_fresh_run_into_another_runs_folder_stops_before_training(tmp_path, env, standins) -> None:
    _run(standins, env, tmp_path, steps=6, checkpoint__every=2)
    first = _run_id(tmp_path / "run")
    checkpoints = tmp_path / "run" / "checkpoints"
    before = {p.name: (p / "model.safetensors").read_bytes() for p in checkpoints.iterdir()}

    with pytest.raises(RunFolderError) as info:
        _run(standins, env, tmp_path, steps=2, checkpoint__every=1)
    message = str(info.value)
    assert (
        message.startswith("output_dir: ")
        and f"run {first}: 3 checkpoint(s) step_000002..step_000006" in message
    )
    assert "--resume" in message and "--new-run" in message and "--overwrite" in message
    # Nothing of the first run changed, and it is still the one recorded.
    assert {p.name: (p / "model.safetensors").read_bytes() for p in checkpoints.iterdir()} == before
    assert _run_id(tmp_path / "run") == first


def test_new_run_keeps_the_earlier_run_and_prunes_only_its_own(tmp_path, env, standins) -> None:
    # The reported loss: a second run with keep_last=3 ranked checkpoints by step across both runs, kept
    # the first run's higher steps and deleted its own, final one included.
    _run(standins, env, tmp_path, steps=30, checkpoint__every=10)
    first = _run_id(tmp_path / "run")
    second = _run(standins, env, tmp_path, steps=4, checkpoint__every=1, checkpoint__existing_run="new_run")
    root = tmp_path / "run" / "checkpoints"
    assert _names(root) == ["step_000002", "step_000003", "step_000004"]  # its own newest three
    assert _run_id(tmp_path / "run") == second.checkpointer.run_id != first
    kept = tmp_path / "run" / "previous-runs" / first
    assert _names(kept / "checkpoints") == ["step_000010", "step_000020", "step_000030"]
    assert len((kept / "metrics.jsonl").read_text().splitlines()) == 30
    assert len((tmp_path / "run" / "metrics.jsonl").read_text().splitlines()) == 4
    archived = Checkpointer(kept / "checkpoints", keep_last=3)
    assert archived.newest_intact()[0].name == "step_000030"  # moved whole: it still verifies


def test_overwrite_deletes_the_earlier_run(tmp_path, env, standins) -> None:
    _run(standins, env, tmp_path, steps=4, checkpoint__every=2)
    first = _run_id(tmp_path / "run")
    _run(standins, env, tmp_path, steps=3, checkpoint__every=3, checkpoint__existing_run="overwrite")
    assert _names(tmp_path / "run" / "checkpoints") == ["step_000003"]
    assert _run_id(tmp_path / "run") != first
    assert not (tmp_path / "run" / "previous-runs").exists()


def test_resume_continues_the_recorded_run(tmp_path, env, standins) -> None:
    _run(standins, env, tmp_path, steps=6, checkpoint__every=2)
    first = _run_id(tmp_path / "run")
    shutil.rmtree(tmp_path / "run" / "checkpoints" / "step_000006")  # as if stopped after step 4
    resumed = _run(standins, env, tmp_path, steps=6, checkpoint__every=2, checkpoint__resume="auto")
    assert resumed.checkpointer.run_id == first and _run_id(tmp_path / "run") == first
    assert _names(tmp_path / "run" / "checkpoints") == ["step_000002", "step_000004", "step_000006"]


def test_pruning_and_clean_up_touch_only_this_runs_checkpoints(tmp_path) -> None:
    root = tmp_path / "ck"

    def save(ck: Checkpointer, step: int) -> None:
        ck.save(
            step,
            write_model=lambda folder: torch.save({"w": torch.zeros(2)}, folder / "w.pt"),
            optimizer_state={},
            rank_state={},
            trainer_state={"step": step},
            config={},
        )

    mine, other = (
        Checkpointer(root, keep_last=2, run_id="mine"),
        Checkpointer(root, keep_last=2, run_id="other"),
    )
    for step in (10, 20, 30):
        save(other, step)
    for step in (1, 2, 3):
        save(mine, step)  # the other run's higher steps must not push these out
    assert [p.name for p in mine.all("mine")] == ["step_000002", "step_000003"]
    assert [p.name for p in other.all("other")] == ["step_000020", "step_000030"]
    # A save of the other run in progress (it may be alive, writing into a shared checkpoint.dir).
    (root / ".tmp-other-step_000040").mkdir()
    (root / ".tmp-mine-step_000004").mkdir()
    assert [p.name for p in mine.remove_partial()] == [".tmp-mine-step_000004"]
    assert (root / ".tmp-other-step_000040").is_dir()
    # Never replace another run's checkpoint of the same step.
    with pytest.raises(Exception, match="belongs to run other"):
        save(mine, 30)
    assert Checkpointer(root, keep_last=1).newest_intact("other")[0].name == "step_000030"


def test_command_line_flags_for_an_existing_run() -> None:
    parser = build_parser()
    args = parser.parse_args(["train", "--new-run"])
    assert args.existing_run == "new_run"
    assert parser.parse_args(["train", "--overwrite"]).existing_run == "overwrite"
    assert parser.parse_args(["train"]).existing_run is None
    with pytest.raises(SystemExit):
        parser.parse_args(["train", "--new-run", "--overwrite"])


def test_resume_with_another_batch_size_stops_at_the_start(tmp_path, env, standins) -> None:
    _run(standins, env, tmp_path, steps=4, checkpoint__every=2)
    with pytest.raises(gr00t_train.ConfigError) as info:
        _run(standins, env, tmp_path, steps=4, checkpoint__resume="auto", data__batch_size=8)
    message = str(info.value)
    assert message.startswith("data.batch_size: this run differs from ") and "step_000004" in message
    assert "(data.batch_size 4 -> 8)" in message and "--set data.batch_size=4" in message


def test_resume_with_another_cpu_thread_count_warns_and_continues(tmp_path, env, standins, caplog) -> None:
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        _run(standins, env, tmp_path, steps=6, checkpoint__every=2)
        shutil.rmtree(tmp_path / "run" / "checkpoints" / "step_000006")  # as if stopped after step 4
        state = json.loads(
            (tmp_path / "run" / "checkpoints" / "step_000004" / "trainer_state.json").read_text()
        )
        assert state["cpu_threads"] == 1
        torch.set_num_threads(2)
        with caplog.at_level("WARNING", logger="gr00t_train"):
            trainer = _run(standins, env, tmp_path, steps=6, checkpoint__resume="auto")
    finally:
        torch.set_num_threads(before)
    assert trainer.step == 6
    assert "written with 1 CPU compute threads, now 2" in caplog.text


def test_a_run_that_failed_at_its_start_does_not_block_the_next(tmp_path, env, standins) -> None:
    # Nothing was trained or logged: the folder holds nothing to protect, so a corrected rerun just starts.
    parts = standins.make_parts()

    def crash(module, batch):
        raise RuntimeError("a bug in the first step")

    parts.loss_fn = crash
    with pytest.raises(RuntimeError, match="a bug in the first step"):
        Trainer(standins.small_config(tmp_path, steps=2), parts, env).fit()
    assert (tmp_path / "run" / "run.json").is_file()
    _run(standins, env, tmp_path, steps=2)
