"""Checkpoints written atomically: everything goes into a temporary folder that is renamed into place only
when complete, so a run killed mid-save leaves the previous checkpoint intact. Keeps the newest N.

Layout of `<dir>/step_000100/`:
    model files          written by the model's own saver (gr00t_model: config.json + model.safetensors)
    train_config.json    the resolved training config
    trainer_state.json   step, samples seen, world size, lr schedule, metrics
    optimizer.pt         optimizer state (rank 0; vla_overlap's ZeRO-1 state_dict is gathered, full size)
    rank00000.pt         per-rank random state (python, numpy, torch CPU/CUDA) and data-pipeline state
"""

from __future__ import annotations

import json
import logging
import os
import re
import shutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

log = logging.getLogger(__name__)

_STEP_DIR = re.compile(r"^step_(\d+)$")
TRAINER_STATE = "trainer_state.json"
TRAIN_CONFIG = "train_config.json"


def step_dir_name(step: int) -> str:
    """Folder name of the checkpoint taken after `step` optimizer steps."""
    return f"step_{step:06d}"


@dataclass
class LoadedCheckpoint:
    """What one rank reads back from a checkpoint."""

    path: Path
    trainer_state: dict[str, Any]
    optimizer_state: dict[str, Any] | None
    rank_state: dict[str, Any]


class Checkpointer:
    """Saves and finds checkpoints under `root`. Every rank calls `save` and `load`; rank 0 owns the
    folder operations, `barrier` keeps ranks in step (a no-op in a single process)."""

    def __init__(
        self,
        root: str | Path,
        keep_last: int,
        rank: int = 0,
        barrier: Callable[[], None] = lambda: None,
    ) -> None:
        self.root = Path(root)
        self.keep_last = keep_last
        self.rank = rank
        self.barrier = barrier

    # ----------------------------------------------------------------------------------------- saving
    def save(
        self,
        step: int,
        *,
        write_model: Callable[[Path], None],
        optimizer_state: dict[str, Any],
        rank_state: dict[str, Any],
        trainer_state: dict[str, Any],
        config: dict[str, Any],
    ) -> Path:
        """Write the checkpoint of `step`; returns its final folder."""
        final = self.root / step_dir_name(step)
        tmp = self.root / f".tmp-{final.name}"
        if self.rank == 0:
            self.root.mkdir(parents=True, exist_ok=True)
            shutil.rmtree(tmp, ignore_errors=True)
            tmp.mkdir()
        self.barrier()
        rank_file = f"rank{self.rank:05d}.pt"
        _torch_save(rank_state, tmp / rank_file)
        if self.rank == 0:
            _torch_save(optimizer_state, tmp / "optimizer.pt")
            write_model(tmp)
            _write_json(tmp / TRAIN_CONFIG, config)
            _write_json(tmp / TRAINER_STATE, trainer_state)
        self.barrier()
        if self.rank == 0:
            _fsync_tree(tmp)
            self._publish(tmp, final)
            self._prune()
        self.barrier()
        return final

    def _publish(self, tmp: Path, final: Path) -> None:
        old = None
        if final.exists():
            old = final.with_name(f".old-{final.name}")
            shutil.rmtree(old, ignore_errors=True)
            os.rename(final, old)
        os.rename(tmp, final)
        _fsync_dir(self.root)
        if old is not None:
            shutil.rmtree(old, ignore_errors=True)
        log.info("saved checkpoint %s", final)

    def _prune(self) -> None:
        for path in self.all()[: -self.keep_last]:
            shutil.rmtree(path, ignore_errors=True)
            log.info("removed old checkpoint %s (checkpoint.keep_last=%d)", path, self.keep_last)

    def remove_partial(self) -> list[Path]:
        """Delete leftovers of saves that were killed before completing (rank 0); returns what was removed."""
        if self.rank != 0 or not self.root.is_dir():
            return []
        stale = [p for p in self.root.iterdir() if p.name.startswith((".tmp-", ".old-"))]
        for path in stale:
            log.warning("removing incomplete checkpoint %s (a save was interrupted)", path)
            shutil.rmtree(path, ignore_errors=True)
        return stale

    # ---------------------------------------------------------------------------------------- loading
    def all(self) -> list[Path]:
        """Complete checkpoints under the root, oldest first."""
        if not self.root.is_dir():
            return []
        found = [
            (int(m.group(1)), p)
            for p in self.root.iterdir()
            if (m := _STEP_DIR.match(p.name)) and (p / TRAINER_STATE).is_file()
        ]
        return [p for _, p in sorted(found)]

    def latest(self) -> Path | None:
        """The newest complete checkpoint, or None."""
        found = self.all()
        return found[-1] if found else None

    def load(self, path: str | Path) -> LoadedCheckpoint:
        """Read this rank's part of a checkpoint."""
        path = Path(path)
        state_file = path / TRAINER_STATE
        if not state_file.is_file():
            raise FileNotFoundError(f"{path} is not a complete checkpoint: {TRAINER_STATE} is missing")
        trainer_state = json.loads(state_file.read_text())
        saved_world = trainer_state.get("world_size", 1)
        rank_file = path / f"rank{self.rank:05d}.pt"
        if not rank_file.is_file():
            raise FileNotFoundError(
                f"{rank_file} is missing: the checkpoint was written by {saved_world} processes, "
                f"this is rank {self.rank}"
            )
        optim_file = path / "optimizer.pt"
        optimizer_state = _torch_load(optim_file) if optim_file.is_file() else None
        return LoadedCheckpoint(path, trainer_state, optimizer_state, _torch_load(rank_file))


def _torch_save(obj: Any, path: Path) -> None:
    with open(path, "wb") as f:
        torch.save(obj, f)


def _torch_load(path: Path) -> Any:
    return torch.load(path, map_location="cpu", weights_only=True)


def _write_json(path: Path, data: dict[str, Any]) -> None:
    path.write_text(json.dumps(data, indent=2) + "\n")


def _fsync_tree(folder: Path) -> None:
    # Data must be on disk before the rename makes the checkpoint visible, or a crash could publish
    # a folder of truncated files.
    for path in sorted(folder.rglob("*")):
        if path.is_file():
            fd = os.open(path, os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
    _fsync_dir(folder)


def _fsync_dir(folder: Path) -> None:
    fd = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
