"""Checkpoints: atomic publication, pruning, clear errors, and a process killed in the middle of a save."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import gr00t_train
import pytest
import torch
from gr00t_train import Checkpointer, Trainer

STANDINS = Path(__file__).with_name("standins.py")


def _save(ck: Checkpointer, step: int, value: float = 1.0) -> Path:
    def write_model(folder: Path) -> None:
        torch.save({"w": torch.full((3,), value)}, folder / "weights.pt")

    return ck.save(
        step,
        write_model=write_model,
        optimizer_state={"state": {}, "param_groups": []},
        rank_state={"rng": {"x": torch.arange(3)}, "data": {"position": step}},
        trainer_state={"step": step, "world_size": 1},
        config={"steps": 10},
    )


def test_save_load_prune_and_overwrite(tmp_path) -> None:
    ck = Checkpointer(tmp_path / "ck", keep_last=2)
    assert ck.latest() is None
    for step in (1, 2, 3):
        _save(ck, step)
    assert [p.name for p in ck.all()] == ["step_000002", "step_000003"]
    loaded = ck.load(ck.latest())
    assert loaded.trainer_state["step"] == 3 and loaded.rank_state["data"] == {"position": 3}
    assert loaded.optimizer_state == {"state": {}, "param_groups": []}
    assert json.loads((ck.latest() / "train_config.json").read_text()) == {"steps": 10}
    _save(ck, 3, value=7.0)  # saving a step again replaces it whole
    assert torch.load(ck.latest() / "weights.pt")["w"][0] == 7.0
    assert sorted(p.name for p in (tmp_path / "ck").iterdir()) == ["step_000002", "step_000003"]


def test_incomplete_folders_are_ignored_and_removed(tmp_path) -> None:
    ck = Checkpointer(tmp_path / "ck", keep_last=3)
    _save(ck, 4)
    (tmp_path / "ck" / ".tmp-step_000006").mkdir()
    (tmp_path / "ck" / "step_000009").mkdir()  # no trainer_state.json: not a checkpoint
    assert ck.latest().name == "step_000004"
    removed = ck.remove_partial()
    assert [p.name for p in removed] == [".tmp-step_000006"]
    with pytest.raises(FileNotFoundError, match="step_000009 is not a complete checkpoint"):
        ck.load(tmp_path / "ck" / "step_000009")
    with pytest.raises(FileNotFoundError, match="written by 1 processes, this is rank 1"):
        Checkpointer(tmp_path / "ck", keep_last=3, rank=1).load(tmp_path / "ck" / "step_000004")


_KILLED_RUN = """
import importlib.util, sys
from pathlib import Path
import torch
spec = importlib.util.spec_from_file_location("gr00t_train_standins", {standins!r})
standins = importlib.util.module_from_spec(spec); sys.modules[spec.name] = standins; spec.loader.exec_module(standins)
import gr00t_train
torch.set_num_threads(1)
env = gr00t_train.init_distributed("cpu")
cfg = standins.small_config(Path({tmp!r}), steps=6, checkpoint__every=2)
parts = standins.make_parts()
saves = []
def save(module, folder):
    saves.append(folder)
    (standins.slow_save if len(saves) == 2 else standins.save_weights)(module, folder)
parts.save_model = save
gr00t_train.Trainer(cfg, parts, env).fit()
"""


@pytest.mark.timeout(120)
def test_kill_during_save_keeps_the_previous_checkpoint(tmp_path, env, standins) -> None:
    script = tmp_path / "run_and_hang.py"
    script.write_text(textwrap.dedent(_KILLED_RUN.format(standins=str(STANDINS), tmp=str(tmp_path))))
    proc = subprocess.Popen([sys.executable, str(script)], env={**os.environ, "OMP_NUM_THREADS": "1"})
    marker = tmp_path / "run" / "SAVING"
    deadline = time.monotonic() + 90
    while not marker.exists():
        assert proc.poll() is None, "the training subprocess ended before its second save"
        assert time.monotonic() < deadline, "the second save never started"
        time.sleep(0.1)
    proc.send_signal(signal.SIGKILL)
    proc.wait()

    root = tmp_path / "run" / "checkpoints"
    run_id = json.loads((tmp_path / "run" / "run.json").read_text())["run_id"]
    assert sorted(p.name for p in root.iterdir()) == [f".tmp-{run_id}-step_000004", "step_000002"]
    ck = Checkpointer(root, keep_last=3)
    assert ck.latest().name == "step_000002"
    assert ck.load(ck.latest()).trainer_state["step"] == 2

    # Resuming picks the intact checkpoint, clears the partial one and finishes the run.
    cfg = standins.small_config(tmp_path, steps=6, checkpoint__every=2, checkpoint__resume="auto")
    trainer = Trainer(cfg, standins.make_parts(), env)
    trainer.fit()
    assert trainer.step == 6 and trainer.parts.data.position == 6
    assert sorted(p.name for p in root.iterdir()) == ["step_000002", "step_000004", "step_000006"]


def test_resume_from_a_missing_path_is_an_error(tmp_path, env, standins) -> None:
    cfg = standins.small_config(tmp_path, steps=2, checkpoint__resume=str(tmp_path / "nowhere"))
    with pytest.raises(gr00t_train.ConfigError, match="checkpoint.resume: .*nowhere cannot be resumed from"):
        Trainer(cfg, standins.make_parts(), env).fit()


def test_resume_auto_without_checkpoint_starts_fresh(tmp_path, env, standins) -> None:
    cfg = gr00t_train.apply_overrides(standins.small_config(tmp_path, steps=2), ["checkpoint.resume=auto"])
    trainer = Trainer(cfg, standins.make_parts(), env)
    trainer.fit()
    assert trainer.step == 2
