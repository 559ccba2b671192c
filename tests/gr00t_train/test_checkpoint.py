"""Checkpoints: atomic publication, pruning, clear errors, and a process killed in the middle of a save."""

from __future__ import annotations

import json
import logging
import os
import signal
import socket
import stat
import subprocess
import sys
import textwrap
import time
import zipfile
from pathlib import Path

import gr00t_train
import pytest
import torch
from gr00t_train import Checkpointer, Trainer
from gr00t_train.checkpoint.manifest import check_manifest, check_structure

STANDINS = Path(__file__).with_name("standins.py")


def _save(ck: Checkpointer, step: int, value: float = 1.0) -> Path:  # noqa: D103
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


_STANDIN_RUN = """
import importlib.util, sys, time
from pathlib import Path
import torch
spec = importlib.util.spec_from_file_location("gr00t_train_standins", {standins!r})
standins = importlib.util.module_from_spec(spec); sys.modules[spec.name] = standins; spec.loader.exec_module(standins)
import gr00t_train
torch.set_num_threads(1)
env = gr00t_train.init_distributed("cpu")
"""
"""The start of a script training the stand-in model in a subprocess (to be killed or signalled)."""

_KILLED_RUN = (
    _STANDIN_RUN
    + """cfg = standins.small_config(Path({tmp!r}), steps=6, checkpoint__every=2)
parts = standins.make_parts()
saves = []
def save(module, folder):
    saves.append(folder)
    (standins.slow_save if len(saves) == 2 else standins.save_weights)(module, folder)
parts.save_model = save
gr00t_train.Trainer(cfg, parts, env).fit()
"""
)


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
    # A second run into the same folder while the first is alive: refused before it touches anything
    # (it used to delete the live run's save in progress at start-up).
    try:
        run_id = json.loads((tmp_path / "run" / "run.json").read_text())["run_id"]
        partial = tmp_path / "run" / "checkpoints" / f".tmp-{run_id}-step_000004"
        cfg = standins.small_config(tmp_path, steps=6, checkpoint__every=2, checkpoint__resume="auto")
        with pytest.raises(gr00t_train.RunFolderError) as info:
            Trainer(cfg, standins.make_parts(), env).fit()
        assert f"is in use by another run: pid {proc.pid} on host {socket.gethostname()}" in str(info.value)
        assert (partial / "model.safetensors").is_file()
    finally:
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


def _losses(run) -> dict[int, float]:
    return {
        json.loads(x)["step"]: json.loads(x)["loss"] for x in (run / "metrics.jsonl").read_text().splitlines()
    }


@pytest.mark.parametrize("damage", ["truncate", "flip"])
def test_resume_skips_a_damaged_newest_checkpoint(tmp_path, env, standins, caplog, damage: str) -> None:
    cfg = standins.small_config(tmp_path, steps=6, checkpoint__every=2)
    Trainer(cfg, standins.make_parts(), env).fit()
    reference = _losses(tmp_path / "run")
    newest = tmp_path / "run" / "checkpoints" / "step_000006"
    if damage == "truncate":  # a disk that filled up, a copy cut short
        weights = newest / "model.safetensors"
        weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 2])
        reason = "model.safetensors has"
    else:  # same size, one byte changed: only the hash sees it
        state = newest / "optimizer.pt"
        data = bytearray(state.read_bytes())
        data[len(data) // 2] ^= 0xFF
        state.write_bytes(bytes(data))
        reason = "optimizer.pt does not match its SHA-256"

    resumed = standins.small_config(tmp_path, steps=6, checkpoint__every=2, checkpoint__resume="auto")
    trainer = Trainer(resumed, standins.make_parts(), env)
    with caplog.at_level(logging.WARNING):
        trainer.fit()
    assert f"skipped checkpoint {newest}: {reason}" in caplog.text
    assert "resuming from" in caplog.text and "step_000004, the newest intact checkpoint" in caplog.text
    assert _losses(tmp_path / "run") == reference  # steps 5-6 again, bit for bit, from step 4
    assert Checkpointer(newest.parent, keep_last=3).newest_intact()[0] == newest  # rewritten whole


def test_resume_without_an_intact_checkpoint_stops_naming_each(tmp_path, env, standins) -> None:
    Trainer(standins.small_config(tmp_path, steps=4, checkpoint__every=2), standins.make_parts(), env).fit()
    root = tmp_path / "run" / "checkpoints"
    for step in (2, 4):
        (root / f"step_00000{step}" / "rank00000.pt").write_bytes(b"")
    cfg = standins.small_config(tmp_path, steps=6, checkpoint__resume="auto")
    with pytest.raises(gr00t_train.ConfigError) as info:
        Trainer(cfg, standins.make_parts(), env).fit()
    message = str(info.value)
    assert message.startswith(f"checkpoint.resume: no intact checkpoint in {root} to resume from")
    assert (
        "step_000004: rank00000.pt has 0 bytes" in message
        and "step_000002: rank00000.pt has 0 bytes" in message
    )
    cfg = standins.small_config(tmp_path, steps=6, checkpoint__resume=str(root / "step_000002"))
    with pytest.raises(
        gr00t_train.ConfigError, match="step_000002 cannot be resumed from: rank00000.pt has 0"
    ):
        Trainer(cfg, standins.make_parts(), env).fit()


def test_a_full_disk_during_a_save_is_a_message_and_keeps_earlier_checkpoints(tmp_path) -> None:
    # /dev/full answers every write with ENOSPC, as a full file system does.
    if not (os.path.exists("/dev/full") and stat.S_ISCHR(os.stat("/dev/full").st_mode)):
        pytest.skip("no /dev/full device on this system")
    ck = Checkpointer(tmp_path / "ck", keep_last=3, run_id="r")
    _save(ck, 2)

    def write_model_to_a_full_disk(folder: Path) -> None:
        (folder / "model.bin").symlink_to("/dev/full")
        with open(folder / "model.bin", "wb") as f:
            f.write(b"\0" * 2**20)

    with pytest.raises(gr00t_train.CheckpointError) as info:
        ck.save(
            4,
            write_model=write_model_to_a_full_disk,
            optimizer_state={},
            rank_state={},
            trainer_state={"step": 4},
            config={},
        )
    message = str(info.value)
    assert (
        f"cannot write checkpoint {tmp_path / 'ck' / 'step_000004'}: No space left on device (ENOSPC"
        in message
    )
    assert "earlier checkpoints are intact (step_000002)" in message
    assert sorted(p.name for p in (tmp_path / "ck").iterdir()) == ["step_000002"]  # the partial save is gone
    assert ck.newest_intact("r")[0].name == "step_000002"


_PREEMPTED_RUN = (
    _STANDIN_RUN
    + """cfg = standins.small_config(Path({tmp!r}), steps=500, logging__every=50)
parts = standins.make_parts()
steps = []
def slow_loss(module, batch):
    steps.append(1)
    if len(steps) == 3:
        (Path({tmp!r}) / "READY").write_text("")
    time.sleep(0.02)
    return standins.noisy_mse(module, batch)
parts.loss_fn = slow_loss
try:
    gr00t_train.Trainer(cfg, parts, env).fit()
except gr00t_train.TrainingInterrupted as err:
    print("INTERRUPTED", err.signal_name, err.step, err.checkpoint, flush=True)
    sys.exit(3)
"""
)


@pytest.mark.timeout(120)
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_sigterm_and_sigint_save_a_checkpoint_then_stop(tmp_path, env, standins, sig) -> None:
    script = tmp_path / "preempted.py"
    script.write_text(textwrap.dedent(_PREEMPTED_RUN.format(standins=str(STANDINS), tmp=str(tmp_path))))
    proc = subprocess.Popen(
        [sys.executable, str(script)],
        env={**os.environ, "OMP_NUM_THREADS": "1"},
        stdout=subprocess.PIPE,
        text=True,
    )
    deadline = time.monotonic() + 90
    while not (tmp_path / "READY").exists():
        assert proc.poll() is None and time.monotonic() < deadline, "the training subprocess did not start"
        time.sleep(0.05)
    proc.send_signal(sig)
    out, _ = proc.communicate(timeout=60)
    assert proc.returncode == 3, out
    name, step, path = out.split("INTERRUPTED ")[1].split()
    assert name == sig.name and 3 <= int(step) < 500
    saved = Path(path)
    assert (
        saved.name == f"step_{int(step):06d}"
        and gr00t_train.Checkpointer(saved.parent, 3).newest_intact()[0] == saved
    )
    rows = [json.loads(x) for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == list(range(1, int(step) + 1))  # flushed before the checkpoint

    # The stopped run continues from it.
    cfg = standins.small_config(  # stopping earlier on the same schedule: a change named to allow it
        tmp_path, steps=int(step) + 2, checkpoint__resume="auto", checkpoint__resume_changed="steps"
    )
    trainer = Trainer(cfg, standins.make_parts(), env)
    trainer.fit()
    assert trainer.step == int(step) + 2


def test_files_written_without_crc_pass_the_format_check_and_only_the_manifest_sees_their_bytes(
    tmp_path,
) -> None:
    ck = Checkpointer(tmp_path / "ck", keep_last=3)
    step = _save(ck, 2)
    target = step / "rank00000.pt"
    with zipfile.ZipFile(target) as archive:
        info = next(i for i in archive.infolist() if "/data/" in i.filename)
    assert info.CRC == 0  # left out by the writer
    assert check_structure(step) is None and check_manifest(step) is None
    data = bytearray(target.read_bytes())
    data[info.header_offset + 30 + len(info.filename) + len(info.extra)] ^= 0xFF  # the record's first byte
    target.write_bytes(bytes(data))
    assert check_structure(step) is None  # nothing in the format to tell
    assert "rank00000.pt" in check_manifest(step)


@pytest.mark.parametrize("damage", ["truncate", "flip"])
def test_without_a_manifest_the_file_formats_are_checked(tmp_path, damage: str) -> None:
    # Checkpoints written before manifests existed (or whose manifest was lost) are judged by their formats.
    ck = Checkpointer(tmp_path / "ck", keep_last=3)
    for step in (2, 4):
        _save(ck, step)
        (tmp_path / "ck" / f"step_00000{step}" / "manifest.json").unlink()
    newest = tmp_path / "ck" / "step_000004"
    from safetensors.torch import save_file

    save_file({"w": torch.arange(64.0)}, str(newest / "model.safetensors"))
    if damage == "truncate":
        target = newest / "model.safetensors"
        size = target.stat().st_size
        target.write_bytes(target.read_bytes()[:-7])
        reason = f"model.safetensors: {size - 7} bytes, its header describes {size}"
    else:
        target = newest / "rank00000.pt"  # as written before checkpoints left torch.save's CRC-32 out
        torch.save(torch.load(target, weights_only=True), target)
        with zipfile.ZipFile(target) as archive:  # where the first tensor's bytes start in the file
            info = next(i for i in archive.infolist() if "/data/" in i.filename)
        data = bytearray(target.read_bytes())
        local = info.header_offset  # local header: 30 bytes, then the name and the extra field
        name_len, extra_len = (
            int.from_bytes(data[local + 26 : local + 28], "little"),
            int.from_bytes(data[local + 28 : local + 30], "little"),
        )
        data[local + 30 + name_len + extra_len] ^= 0xFF
        target.write_bytes(bytes(data))
        reason = f"rank00000.pt: record {info.filename} fails its CRC"
    path, skipped = ck.newest_intact()
    assert path.name == "step_000002"
    assert len(skipped) == 1 and skipped[0].startswith(f"skipped checkpoint {newest}: {reason}")
