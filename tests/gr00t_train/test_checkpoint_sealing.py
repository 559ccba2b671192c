"""A checkpoint's files hashed and flushed as they are written (`Seal`), and the pruning beside the write."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest
import torch
from gr00t_train import Checkpointer
from gr00t_train.checkpoint import manifest as manifest_mod
from gr00t_train.checkpoint.checkpointer import _other_ranks_part
from gr00t_train.checkpoint.manifest import check_manifest, write_manifest
from gr00t_train.checkpoint.sealing import Seal


def _files(folder: Path) -> None:
    (folder / "sub").mkdir(parents=True)
    (folder / "a.bin").write_bytes(bytes(range(250)) * 10)  # three blocks of 1 KiB
    (folder / "empty.bin").write_bytes(b"")
    (folder / "sub" / "b.json").write_text('{"x": 1}')


def test_the_seal_writes_the_manifest_write_manifest_writes(tmp_path, monkeypatch) -> None:
    monkeypatch.setattr(manifest_mod, "_BLOCK", 1024)  # several blocks in a small file
    sealed, plain = tmp_path / "sealed", tmp_path / "plain"
    for folder in (sealed, plain):
        _files(folder)
    with Seal(sealed) as seal:
        seal.add(sealed / "a.bin")  # handed over early; the rest found at the end
        seal.finish({"step": 3})
    write_manifest(plain, {"step": 3})
    ours, theirs = (json.loads((f / "manifest.json").read_text()) for f in (sealed, plain))
    assert ours == theirs
    assert set(ours["files"]) == {"a.bin", "empty.bin", "sub/b.json"}
    assert check_manifest(sealed) is None
    (sealed / "a.bin").write_bytes(os.urandom(2500))
    assert "a.bin does not match its SHA-256" in check_manifest(sealed)


def test_a_missing_file_fails_the_seal_and_stops_its_threads(tmp_path) -> None:
    _files(tmp_path)
    with pytest.raises(FileNotFoundError), Seal(tmp_path) as seal:
        seal.add(tmp_path / "a.bin")
        seal.hashed()
        (tmp_path / "empty.bin").unlink()
        seal.add(tmp_path / "empty.bin")


def test_other_ranks_parts_wait_for_their_markers() -> None:
    assert _other_ranks_part(Path("t/rank00001.pt")) and _other_ranks_part(Path("t/.done-rank00001"))
    assert not _other_ranks_part(Path("t/rank00000.pt")) and not _other_ranks_part(Path("t/optimizer.pt"))


def _save(ck: Checkpointer, step: int, during_model=lambda folder: None) -> Path:
    def write_model(folder: Path) -> None:
        during_model(folder)
        torch.save({"w": torch.zeros(3)}, folder / "weights.pt")

    return ck.save(
        step, write_model=write_model, optimizer_state={"state": {}}, rank_state={"data": step},
        trainer_state={"step": step, "world_size": 1}, config={},
    )  # fmt: skip


def _published(root: Path) -> list[str]:
    return sorted(p.name for p in root.iterdir() if p.name.startswith("step_"))


def _soon(condition, seconds: float = 10.0) -> bool:
    deadline = time.monotonic() + seconds
    while not condition() and time.monotonic() < deadline:
        time.sleep(0.01)
    return condition()


def test_the_checkpoint_a_save_pushes_past_keep_last_goes_while_it_is_written(tmp_path) -> None:
    ck = Checkpointer(tmp_path, keep_last=2, run_id="r")
    _save(ck, 1), _save(ck, 2)
    seen = []

    def during_model(folder: Path) -> None:  # the oldest goes beside the write, the newest stays
        seen.append(_soon(lambda: not (tmp_path / "step_000001").exists()))
        seen.append(_published(tmp_path))

    _save(ck, 3, during_model)
    assert seen == [True, ["step_000002"]]
    assert _published(tmp_path) == ["step_000002", "step_000003"]
    assert check_manifest(tmp_path / "step_000003") is None
    _save(ck, 3, during_model=lambda folder: seen.append(_published(tmp_path)))  # the same step again
    assert seen[-1] == ["step_000002", "step_000003"]  # replacing step 3 pushes nothing out
    assert _published(tmp_path) == ["step_000002", "step_000003"]


def test_with_keep_last_1_the_old_checkpoint_stays_until_the_new_one_is_in_place(tmp_path) -> None:
    ck = Checkpointer(tmp_path, keep_last=1, run_id="r")
    _save(ck, 1)
    seen = []
    _save(ck, 2, during_model=lambda folder: (time.sleep(0.2), seen.append(_published(tmp_path))))
    assert seen == [["step_000001"]]
    assert _published(tmp_path) == ["step_000002"]


def test_a_failed_write_leaves_the_newer_checkpoints(tmp_path) -> None:
    ck = Checkpointer(tmp_path, keep_last=3, run_id="r")
    for step in (1, 2, 3):
        _save(ck, step)

    def fail(folder: Path) -> None:
        raise OSError(5, "Input/output error", str(folder / "weights.pt"))

    with pytest.raises(Exception, match="Input/output error"):
        _save(ck, 4, during_model=fail)
    assert _published(tmp_path) == ["step_000002", "step_000003"]  # keep_last - 1: step 1 made room
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]  # the partial save is gone
