"""Checkpoints written atomically: everything goes into a temporary folder that is renamed into place only
when complete, so a run killed mid-save leaves the previous checkpoint intact. Keeps the newest N of the
run that wrote them (each run has an id, recorded in its checkpoints; other runs' files are never touched).
A manifest of sizes and hashes lets a resume skip a damaged checkpoint for the newest intact one.

Layout of `<dir>/step_000100/`:
    model files          written by the model's own saver (gr00t_model: config.json + model.safetensors),
                         only the tensors neither the base nor the optimizer state holds
    weights.json         where the other tensors come from (`_weights.py`)
    train_config.json    the resolved training config
    trainer_state.json   step, samples seen, world size, lr schedule, metrics
    optimizer.pt         optimizer state (rank 0; vla_overlap's ZeRO-1 state_dict is gathered, full size)
    rank00000.pt         per-rank random state (python, numpy, torch CPU/CUDA) and data-pipeline state
    manifest.json        size and SHA-256 of every file above, written last
"""

from __future__ import annotations

import errno
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

from ._errors import CheckpointError
from ._manifest import MANIFEST, check_manifest, write_manifest

log = logging.getLogger(__name__)

_STEP_DIR = re.compile(r"^step_(\d+)$")
TRAINER_STATE = "trainer_state.json"
TRAIN_CONFIG = "train_config.json"
DATASET_FINGERPRINT = "dataset_meta_sha256"
"""trainer_state.json key: `_dataset_fingerprint.meta_digest` of the run's dataset (older checkpoints hold only
this; newer ones also the whole fingerprint, in `dataset_fingerprint.json`)."""
ANY_RUN = "<any run>"
"""`Checkpointer.all(ANY_RUN)`: checkpoints of every run (None selects those written before runs had ids)."""


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
        run_id: str | None = None,
    ) -> None:
        self.root = Path(root)
        self.keep_last = keep_last
        self.rank = rank
        self.barrier = barrier
        self.run_id = run_id
        """The run whose checkpoints this object writes, prunes and cleans up after (None: unnamed)."""

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
        """Write the checkpoint of `step`; returns its final folder. A full disk (or any other write error)
        raises CheckpointError naming the folder; the partial save is removed, earlier checkpoints stay."""
        final = self.root / step_dir_name(step)
        tmp = (
            self.root / f".tmp-{self.run_id}-{final.name}"
            if self.run_id
            else self.root / f".tmp-{final.name}"
        )
        try:
            if self.rank == 0:
                self.root.mkdir(parents=True, exist_ok=True)
                self._refuse_foreign(final)
                shutil.rmtree(tmp, ignore_errors=True)
                tmp.mkdir()
            self.barrier()
            _torch_save(rank_state, tmp / rank_file_name(self.rank))
            if self.rank == 0:
                _torch_save(optimizer_state, tmp / "optimizer.pt")
                write_model(tmp)
                _write_json(tmp / TRAIN_CONFIG, config)
                _write_json(tmp / TRAINER_STATE, {**trainer_state, "run_id": self.run_id})
            self.barrier()
            if self.rank == 0:
                write_manifest(tmp, {"step": step, "run_id": self.run_id})  # hashes what is on disk
                _fsync_tree(tmp)
                self._publish(tmp, final)
                self._prune()
        except Exception as err:
            if self.rank == 0:
                shutil.rmtree(tmp, ignore_errors=True)  # free the space a partial save took
            reason = _disk_full(err, self.root)
            failed = _os_error(err)
            if reason is None and failed is None:
                raise
            kept = [p.name for p in self.all(self.run_id)]
            if reason is not None:
                advice = (
                    "Free space on that disk, lower checkpoint.keep_last or point checkpoint.dir elsewhere"
                )
            else:
                code = errno.errorcode.get(failed.errno) if failed.errno else None
                detail = ", ".join(x for x in (code, f"writing {failed.filename or tmp}") if x)
                reason = f"{failed.strerror or failed} ({detail})"
                advice = "Make that folder writable (or point checkpoint.dir elsewhere)"
            resume = (
                f", then continue with --resume (from {kept[-1]})"
                if kept
                else "; no checkpoint of this run exists yet, so the run must start again"
            )
            raise CheckpointError(
                f"cannot write checkpoint {final}: {reason}. The partial save was removed; earlier "
                f"checkpoints are intact ({', '.join(kept) or 'none'}). {advice}{resume}."
            ) from err
        self.barrier()
        return final

    def _refuse_foreign(self, final: Path) -> None:
        """Never replace another run's checkpoint of the same step."""
        owner = checkpoint_run_id(final) if (final / TRAINER_STATE).is_file() else self.run_id
        if owner != self.run_id:
            raise CheckpointError(
                f"{final} belongs to run {owner}, not to this run ({self.run_id}); it is left alone. "
                "Use another checkpoint.dir, or start with --new-run / --overwrite."
            )

    def _publish(self, tmp: Path, final: Path) -> None:
        old = None
        if final.exists():
            old = final.with_name(f".old-{self.run_id}-{final.name}" if self.run_id else f".old-{final.name}")
            shutil.rmtree(old, ignore_errors=True)
            os.rename(final, old)
        os.rename(tmp, final)
        _fsync_dir(self.root)
        if old is not None:
            shutil.rmtree(old, ignore_errors=True)
        log.info("saved checkpoint %s", final)

    def _prune(self) -> None:
        for path in self.all(self.run_id)[: -self.keep_last]:
            shutil.rmtree(path, ignore_errors=True)
            log.info("removed old checkpoint %s (checkpoint.keep_last=%d)", path, self.keep_last)

    def remove_partial(self) -> list[Path]:
        """Delete leftovers of this run's saves that were killed before completing (rank 0); returns what was
        removed. Another run's leftovers are left alone: it may be alive, writing into a shared folder."""
        if self.rank != 0 or not self.root.is_dir():
            return []
        mine = (
            (f".tmp-{self.run_id}-", f".old-{self.run_id}-") if self.run_id else (".tmp-step_", ".old-step_")
        )
        stale = [p for p in self.root.iterdir() if p.name.startswith(mine)]
        for path in stale:
            log.warning("removing incomplete checkpoint %s (a save was interrupted)", path)
            shutil.rmtree(path, ignore_errors=True)
        return stale

    # ---------------------------------------------------------------------------------------- loading
    def all(self, run_id: str | None = ANY_RUN) -> list[Path]:
        """Complete checkpoints under the root, oldest first; with `run_id`, only that run's."""
        paths = [p for p in self._step_dirs() if (p / TRAINER_STATE).is_file()]
        return paths if run_id == ANY_RUN else [p for p in paths if checkpoint_run_id(p) == run_id]

    def _step_dirs(self) -> list[Path]:
        """Every `step_N` folder under the root, complete or not, oldest first."""
        if not self.root.is_dir():
            return []
        found = [(int(m.group(1)), p) for p in self.root.iterdir() if (m := _STEP_DIR.match(p.name))]
        return [p for _, p in sorted(found)]

    def latest(self) -> Path | None:
        """The newest complete checkpoint, or None."""
        found = self.all()
        return found[-1] if found else None

    def newest_intact(self, run_id: str | None = ANY_RUN) -> tuple[Path | None, list[str]]:
        """The newest checkpoint (of `run_id`, if given) that matches its manifest, and one line per newer
        checkpoint that was skipped, saying why (a step folder without trainer_state.json included: its
        run is unknown unless its manifest says, so it is named whatever run is asked for)."""
        skipped = []
        candidates = set(self.all(run_id))
        for path in self._step_dirs():
            if not (path / TRAINER_STATE).is_file():
                owner = checkpoint_run_id(path)
                if run_id == ANY_RUN or owner is None or owner == run_id:
                    candidates.add(path)
        for path in sorted(candidates, key=lambda p: int(_STEP_DIR.match(p.name).group(1)), reverse=True):
            reason = verify_checkpoint(path)
            if reason is None:
                return path, skipped
            skipped.append(f"skipped checkpoint {path}: {reason}")
        return None, skipped

    def load(self, path: str | Path, own_rank_state: bool = True) -> LoadedCheckpoint:
        """Read this rank's part of a checkpoint (without its rank file when `own_rank_state` is False: a
        resume at another world size reads the ranks' files with `rank_state`)."""
        path = Path(path)
        state_file = path / TRAINER_STATE
        if not state_file.is_file():
            raise FileNotFoundError(f"{path} is not a complete checkpoint: {TRAINER_STATE} is missing")
        trainer_state = json.loads(state_file.read_text())
        saved_world = trainer_state.get("world_size", 1)
        rank_state: dict[str, Any] = {}
        if own_rank_state:
            rank_state = self.rank_state(path, self.rank)
            if rank_state is None:
                raise FileNotFoundError(
                    f"{path / rank_file_name(self.rank)} is missing: the checkpoint was written by "
                    f"{saved_world} processes, this is rank {self.rank}"
                )
        optim_file = path / "optimizer.pt"
        optimizer_state = _torch_load(optim_file) if optim_file.is_file() else None
        return LoadedCheckpoint(path, trainer_state, optimizer_state, rank_state)

    def rank_state(self, path: str | Path, rank: int) -> dict[str, Any] | None:
        """What rank `rank` saved (random streams, data position), or None when the checkpoint has no file
        of that rank (it was written by fewer processes)."""
        file = Path(path) / rank_file_name(rank)
        return _torch_load(file) if file.is_file() else None


def read_trainer_state(path: str | Path) -> dict[str, Any]:
    """A checkpoint's trainer_state.json (step, samples seen, world size, global batch, schedule)."""
    return json.loads((Path(path) / TRAINER_STATE).read_text())


def rank_file_name(rank: int) -> str:
    """The file of one rank's random streams and data position."""
    return f"rank{rank:05d}.pt"


def checkpoint_run_id(path: Path) -> str | None:
    """The id of the run that wrote a checkpoint (None: written before runs had ids). The manifest says it
    too, for a checkpoint whose trainer_state.json is damaged."""
    for name in (TRAINER_STATE, MANIFEST):
        try:
            return json.loads((path / name).read_text())["run_id"]
        except (OSError, ValueError, KeyError, TypeError):
            continue
    return None


def verify_checkpoint(path: Path) -> str | None:
    """Why the checkpoint at `path` cannot be resumed from, or None when it is intact."""
    if not path.exists():
        return "the folder does not exist"
    if not path.is_dir():
        return "it is a file, not a checkpoint folder"
    if not (path / TRAINER_STATE).is_file():
        return f"{TRAINER_STATE} is missing (an incomplete save)"
    reason = check_manifest(path)
    if reason is not None:
        return reason
    try:
        state = json.loads((path / TRAINER_STATE).read_text())
        int(state["step"])
    except (OSError, ValueError, KeyError, TypeError) as err:
        return f"{TRAINER_STATE} is unreadable ({type(err).__name__}: {err})"
    return None


def _os_error(err: BaseException | None) -> OSError | None:
    """The OSError behind `err` (itself, or what it was raised from), if any."""
    seen = 0
    while err is not None and seen < 8:
        if isinstance(err, OSError):
            return err
        err, seen = err.__cause__ or err.__context__, seen + 1
    return None


def _disk_full(err: BaseException | None, root: Path) -> str | None:
    """A message if `err` (or what it was raised from) means the disk is full. torch's zip writer replaces
    the OSError with a RuntimeError on its way out; safetensors keeps only the text."""
    seen = 0
    while err is not None and seen < 8:
        if isinstance(err, OSError) and err.errno in (errno.ENOSPC, errno.EDQUOT):
            return f"{os.strerror(err.errno)} ({errno.errorcode[err.errno]}, writing {err.filename or root})"
        text = str(err)
        if "No space left on device" in text or "os error 28" in text:
            return f"No space left on device (ENOSPC; {type(err).__name__}: {text.strip()[:200]})"
        err, seen = err.__cause__ or err.__context__, seen + 1
    return None


def _torch_save(obj: Any, path: Path) -> None:
    # Through a file object: a failed write raises OSError with its errno (given a path, torch's zip writer
    # raises a bare RuntimeError), named here with the file it was writing.
    try:
        with open(path, "wb") as f:
            torch.save(obj, f)
    except OSError as err:
        raise OSError(err.errno, err.strerror, str(path)) from err
    except RuntimeError as err:
        cause = err.__context__
        if isinstance(cause, OSError) and cause.filename is None:
            raise OSError(cause.errno, cause.strerror, str(path)) from err
        raise


def _torch_load(path: Path) -> Any:
    try:
        return torch.load(path, map_location="cpu", weights_only=True)
    except Exception as err:  # noqa: BLE001 - said in our words (torch's would suggest weights_only=False)
        raise CheckpointError(unreadable(path, err)) from None


def unreadable(file: Path, err: BaseException) -> str:
    """Why `file` cannot be loaded, in our words: never torch's advice to load it with weights_only=False,
    which would run whatever code the file names."""
    found = re.search(r"GLOBAL ([\w.]+)", str(err))
    if found or "weights_only" in str(err):
        what = f"names {found.group(1)}" if found else "holds objects other than tensors and plain containers"
        return (
            f"{file} {what}: refused, since loading it could run code. gr00t-train writes only tensors and plain "
            "containers there, so the file was altered or comes from elsewhere; resume from another checkpoint."
        )
    return f"{file} cannot be read ({type(err).__name__}): it is damaged; resume from another checkpoint."


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
