"""Checkpoints written in the background (checkpoint.async_save): the loop stalls only to stage the state,
the ranks report their parts through marker files, a failed write follows checkpoint.on_error, and a kill -9
during a background write leaves the previous checkpoint usable."""

from __future__ import annotations

import errno
import json
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import gr00t_train
import pytest
import torch
from gr00t_train import Checkpointer, CheckpointError, Trainer
from gr00t_train.checkpoint.staging import Staging

STANDINS = Path(__file__).with_name("standins.py")


def test_staged_copies_do_not_follow_the_originals() -> None:
    live = torch.arange(4.0)
    tree = {"a": live, "b": [live, (1, "x")], "c": 3}
    staging = Staging(torch.device("cpu"))
    staging.begin()
    staged = staging.copy(tree)
    staging.finish()()
    live.add_(10)
    assert torch.equal(staged["a"], torch.arange(4.0)) and torch.equal(staged["b"][0], torch.arange(4.0))
    assert staged["b"][1] == (1, "x") and staged["c"] == 3
    kept = staging.copy({"a": live}, fresh_cpu=True)  # made for this save: not copied
    assert kept["a"] is live


def _slow(standins, seconds: float, calls: list):
    def save(module, folder: Path) -> None:
        calls.append(time.perf_counter())
        time.sleep(seconds)
        standins.save_weights(module, folder)

    return save


def test_the_loop_goes_on_while_a_checkpoint_is_written(tmp_path, env, standins) -> None:
    cfg = standins.small_config(tmp_path, steps=6, checkpoint__every=2, logging__every=1)
    parts = standins.make_parts()
    calls: list[float] = []
    parts.save_model = _slow(standins, 0.4, calls)

    def slow_loss(module, batch):  # two steps outlast a write: no save waits for the previous one
        time.sleep(0.25)
        return standins.noisy_mse(module, batch)

    parts.loss_fn = slow_loss
    step_times = []
    trainer = Trainer(cfg, parts, env)
    trainer.step_callback = lambda: step_times.append((trainer.step, time.perf_counter()))
    trainer.fit()
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    stalls, writes = summary["checkpoint_stall_s"], summary["checkpoint_write_s"]
    assert len(stalls) == len(writes) == len(summary["checkpoint_bytes"]) == 3
    assert summary["checkpoint_update_wait_s"] == [0.0] * 3  # CPU: the copies end before the save returns
    assert all(w >= 0.4 for w in writes) and max(stalls) < 0.3  # the writes took longer than the loop waited
    assert summary["checkpoint_failures"] == []
    for total, parts in zip(writes, summary["checkpoint_write_parts_s"]):  # each write by part, adding up
        assert list(parts) == [
            "ready", "decode_moments", "rank_file", "optimizer", "model", "json", "other_ranks", "manifest",
            "fsync", "publish", "prune",
        ]  # fmt: skip
        assert parts["model"] >= 0.4 and sum(parts.values()) == pytest.approx(total, abs=0.02)
    final = summary["checkpoint_final_wait_s"]  # the final save's 0.4 s write is waited for, and timed
    assert set(final) == {"write"} and final["write"] >= 0.3
    sizes = [sum(p.stat().st_size for p in d.rglob("*") if p.is_file()) for d in _steps(tmp_path)]
    assert summary["checkpoint_bytes"] == sizes
    steps_after_first_save = [t for s, t in step_times if s == 3]
    assert steps_after_first_save[0] < calls[0] + 0.4  # step 3 ran while step 2's files were written
    root = tmp_path / "run" / "checkpoints"
    assert Checkpointer(root, keep_last=3).newest_intact()[0].name == "step_000006"
    assert not [p for p in root.iterdir() if p.name.startswith(".")]  # no temporary folder, no marker left


def _steps(tmp_path: Path) -> list[Path]:
    return sorted((tmp_path / "run" / "checkpoints").glob("step_*"))


def _failing(standins, at: int, calls: list):
    def save(module, folder: Path) -> None:
        calls.append(folder)
        if len(calls) == at:
            raise OSError(errno.ENOSPC, "No space left on device", str(folder / "model.safetensors"))
        standins.save_weights(module, folder)

    return save


def test_a_failed_background_write_goes_on_with_on_error_continue(tmp_path, env, standins, caplog) -> None:
    cfg = standins.small_config(tmp_path, steps=6, checkpoint__every=2, checkpoint__on_error="continue")
    parts = standins.make_parts()
    parts.save_model = _failing(standins, 2, [])
    Trainer(cfg, parts, env).fit()
    assert [p.name for p in _steps(tmp_path)] == ["step_000002", "step_000006"]
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    (failure,) = summary["checkpoint_failures"]
    assert failure["step"] == 4 and failure["on_error"] == "continue"
    assert (
        "cannot write checkpoint" in failure["error"]
        and "step_000004: No space left on device" in failure["error"]
    )
    assert "the checkpoint of step 4 could not be written" in caplog.text  # said at once, in the log
    assert len(summary["checkpoint_stall_s"]) == 3 and len(summary["checkpoint_bytes"]) == 2


def test_a_failed_background_write_stops_the_run_with_on_error_stop(tmp_path, env, standins) -> None:
    cfg = standins.small_config(tmp_path, steps=8, checkpoint__every=2)  # on_error=stop is the default
    parts = standins.make_parts()
    parts.save_model = _failing(standins, 2, [])
    trainer = Trainer(cfg, parts, env)
    with pytest.raises(
        CheckpointError, match=r"step_000004: No space left on device .* intact \(step_000002\)"
    ):
        trainer.fit()
    assert trainer.step == 6  # stopped at the next checkpoint, where every rank meets
    assert [p.name for p in _steps(tmp_path)] == ["step_000002"]


def _write(ck: Checkpointer, step: int, rank_state=None) -> Path:
    return ck.write(
        step, write_model=lambda folder: (folder / "weights.bin").write_bytes(b"w"),
        optimizer_state={}, rank_state=rank_state or {"x": torch.ones(1)}, trainer_state={"step": step},
        config={}, world_size=2,
    )  # fmt: skip


def test_rank_0_publishes_once_every_rank_marked_its_part(tmp_path) -> None:
    zero, one = (Checkpointer(tmp_path, keep_last=3, rank=r, run_id="r") for r in (0, 1))
    zero.begin(2)
    late = threading.Timer(0.3, lambda: _write(one, 2))
    late.start()
    final = _write(zero, 2)  # waits for rank 1's marker
    late.join()
    assert sorted(p.name for p in final.iterdir()) == [
        "manifest.json", "optimizer.pt", "rank00000.pt", "rank00001.pt", "train_config.json",
        "trainer_state.json", "weights.bin",
    ]  # fmt: skip
    assert zero.newest_intact("r")[0] == final

    def failing_rank_1() -> None:
        with pytest.raises(AttributeError):  # a lambda cannot be pickled: rank 1's part fails
            _write(one, 4, {"f": lambda: 0})

    zero.begin(4)
    other = threading.Thread(target=failing_rank_1)
    other.start()
    with pytest.raises(CheckpointError, match=r"rank 1 could not write its part \(AttributeError"):
        _write(zero, 4)
    other.join()
    zero.begin(6)
    zero.rank_timeout_s = 0.2
    with pytest.raises(CheckpointError, match=r"rank\(s\) 1 did not finish their part \(within 0 s\)"):
        _write(zero, 6)
    zero.begin(8)
    zero.abandon.set()
    with pytest.raises(CheckpointError, match="did not finish their part .the run failed."):
        _write(zero, 8)
    assert [p.name for p in tmp_path.iterdir()] == ["step_000002"]  # the failed saves left nothing


_KILLED = """
import importlib.util, sys, time
from pathlib import Path
import torch
spec = importlib.util.spec_from_file_location("gr00t_train_standins", {standins!r})
standins = importlib.util.module_from_spec(spec); sys.modules[spec.name] = standins; spec.loader.exec_module(standins)
import gr00t_train
torch.set_num_threads(1)
env = gr00t_train.init_distributed("cpu")
cfg = standins.small_config(Path({tmp!r}), steps=8, checkpoint__every=2, logging__every=1,
                            checkpoint__async_save={async_save!r})
parts = standins.make_parts()
saves = []
def save(module, folder):
    saves.append(folder)
    (standins.slow_save if len(saves) == 2 else standins.save_weights)(module, folder)
parts.save_model = save
gr00t_train.Trainer(cfg, parts, env).fit()
"""


@pytest.mark.timeout(120)
@pytest.mark.parametrize("async_save", [True, False], ids=["background", "in-the-loop"])
def test_kill_9_during_a_write_keeps_the_previous_checkpoint(tmp_path, env, standins, async_save) -> None:
    script = tmp_path / "run_and_hang.py"
    script.write_text(
        textwrap.dedent(_KILLED.format(standins=str(STANDINS), tmp=str(tmp_path), async_save=async_save))
    )
    proc = subprocess.Popen([sys.executable, str(script)], env={**os.environ, "OMP_NUM_THREADS": "1"})
    marker, metrics = tmp_path / "run" / "SAVING", tmp_path / "run" / "metrics.jsonl"
    deadline = time.monotonic() + 90
    try:
        while not marker.exists() or (async_save and _logged(metrics) < 6):  # the loop went on past step 4
            assert proc.poll() is None, "the training subprocess ended before its second save"
            assert time.monotonic() < deadline, "the second save never started"
            time.sleep(0.05)
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    root = tmp_path / "run" / "checkpoints"
    run_id = json.loads((tmp_path / "run" / "run.json").read_text())["run_id"]
    assert sorted(p.name for p in root.iterdir()) == [f".tmp-{run_id}-step_000004", "step_000002"]
    assert Checkpointer(root, keep_last=3).newest_intact()[0].name == "step_000002"
    cfg = standins.small_config(tmp_path, steps=8, checkpoint__every=2, checkpoint__resume="auto")
    trainer = Trainer(cfg, standins.make_parts(), env)
    trainer.fit()
    assert trainer.step == 8 and sorted(p.name for p in root.iterdir())[-1] == "step_000008"


def _logged(metrics: Path) -> int:
    try:
        return max((json.loads(line)["step"] for line in metrics.read_text().splitlines()), default=0)
    except (OSError, ValueError):
        return 0


def test_the_in_the_loop_save_is_kept_for_comparison(tmp_path, env, standins) -> None:
    cfg = standins.small_config(tmp_path, steps=4, checkpoint__every=2, checkpoint__async_save=False)
    parts = standins.make_parts()
    calls: list[float] = []
    parts.save_model = _slow(standins, 0.3, calls)
    Trainer(cfg, parts, env).fit()
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert min(summary["checkpoint_stall_s"]) >= 0.3  # the loop waited for the files
    for total, parts in zip(summary["checkpoint_write_s"], summary["checkpoint_write_parts_s"]):
        assert parts["model"] >= 0.3 and "barrier" in parts
        assert sum(parts.values()) == pytest.approx(total, abs=0.02)
    assert [p.name for p in _steps(tmp_path)] == ["step_000002", "step_000004"]
    assert gr00t_train.TrainConfig().checkpoint.async_save is True
