"""Checkpoints written atomically: everything goes into a temporary folder that is renamed into place only
when complete, so a run killed mid-save leaves the previous checkpoint intact. Keeps the newest N of the
run that wrote them (each run has an id, recorded in its checkpoints; other runs' files are never touched).
A manifest of sizes and hashes lets a resume skip a damaged checkpoint for the newest intact one.

Layout of `<dir>/step_000100/`:
    model files          written by the model's own saver (gr00t_model: config.json + model.safetensors),
                         only the tensors neither the base nor the optimizer state holds
    weights.json         where the other tensors come from (`checkpoint/weights.py`)
    train_config.json    the resolved training config
    trainer_state.json   step, samples seen, world size, lr schedule, metrics
    optimizer.pt         optimizer state (rank 0; vla_overlap's ZeRO-1 state_dict is gathered, full size)
    rank00000.pt         per-rank random state (python, numpy, torch CPU/CUDA) and data-pipeline state
    manifest.json        size and SHA-256 of every file above, written last

A save is `begin` (every rank, main thread: rank 0 makes the temporary folder, then a barrier) and `write`
(every rank its own files, then a marker file; rank 0 waits for the markers, then writes the manifest and
renames): `write` runs no collective, so it can run in a background thread beside training (`checkpoint.async_save`).
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import re
import shutil
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .._errors import CheckpointError
from ..metrics.timing import LapClock
from .files import _fsync, _torch_load, _torch_save, _write_json
from .manifest import MANIFEST, check_manifest
from .save_errors import save_error
from .sealing import Seal

log = logging.getLogger(__name__)

_STEP_DIR = re.compile(r"^step_(\d+)$")
TRAINER_STATE = "trainer_state.json"
TRAIN_CONFIG = "train_config.json"
DATASET_FINGERPRINT = "dataset_meta_sha256"
"""trainer_state.json key: `data.fingerprint.meta_digest` of the run's dataset (older checkpoints hold only
this; newer ones also the whole fingerprint, in `dataset_fingerprint.json`)."""
RANK_TIMEOUT_S = 600.0
"""How long rank 0 waits for the other ranks' parts of a checkpoint once its own are written."""
_DONE, _FAILED = ".done-rank{:05d}", ".failed-rank{:05d}"
"""Markers in the temporary folder: a rank's part is written, or why it could not be."""
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
        self.rank_timeout_s = RANK_TIMEOUT_S
        self.abandon = threading.Event()
        """Set when the run failed: a save still waiting for other ranks' parts gives up at once."""
        self.write_clock = LapClock()
        """The parts of the last `write` (summary.json's checkpoint_write_parts_s)."""

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
        world_size: int = 1,
    ) -> Path:
        """Write the checkpoint of `step` in this thread (every rank); returns its final folder. A full disk
        (or any other write error) raises CheckpointError naming the folder; the partial save is removed,
        earlier checkpoints stay."""
        self.begin(step)
        final = self.write(
            step, write_model=write_model, optimizer_state=optimizer_state, rank_state=rank_state,
            trainer_state=trainer_state, config=config, world_size=world_size,
        )  # fmt: skip
        self.barrier()
        return final

    def begin(self, step: int) -> Path:
        """Start the save of `step` (every rank, in the main thread: it ends with a barrier): rank 0 makes
        its temporary folder, refusing another run's checkpoint of that step. Returns the temporary folder."""
        final, tmp = self._folders(step)
        try:
            if self.rank == 0:
                self.root.mkdir(parents=True, exist_ok=True)
                self._refuse_foreign(final)
                shutil.rmtree(tmp, ignore_errors=True)
                tmp.mkdir()
        except OSError as err:
            error = save_error(err, final, tmp, self._kept())
            raise (error or err) from err
        self.barrier()
        return tmp

    def write(
        self,
        step: int,
        *,
        write_model: Callable[[Path], None],
        optimizer_state: dict[str, Any],
        rank_state: dict[str, Any],
        trainer_state: dict[str, Any],
        config: dict[str, Any],
        world_size: int = 1,
    ) -> Path:
        """This rank's files of the save `begin` started; then on rank 0, once every rank has marked its part
        done, the manifest, the rename into place and the pruning. No collectives: it may run in a background
        thread while training runs its own. Returns the final folder."""
        final, tmp = self._folders(step)
        clock = self.write_clock = LapClock()
        try:
            _torch_save(rank_state, tmp / rank_file_name(self.rank))
            clock.lap("rank_file")
            if self.rank != 0:
                (tmp / _DONE.format(self.rank)).touch()
                return final
            with self._pruning_beside(final), Seal(tmp) as seal:
                seal.add(tmp / rank_file_name(0))
                _torch_save(optimizer_state, tmp / "optimizer.pt")
                seal.add(tmp / "optimizer.pt")  # hashed and flushed while the model is written
                clock.lap("optimizer")
                write_model(tmp)
                clock.lap("model")
                _write_json(tmp / TRAIN_CONFIG, config)
                _write_json(tmp / TRAINER_STATE, {**trainer_state, "run_id": self.run_id})
                seal.add_rest(but=_other_ranks_part)
                clock.lap("json")
                self._wait_for_ranks(tmp, final, world_size)
                clock.lap("other_ranks")
                seal.add_rest()
                seal.hashed()
                clock.lap("manifest")
                seal.finish({"step": step, "run_id": self.run_id})
                clock.lap("fsync")
                self._publish(tmp, final)
                clock.lap("publish")
            self._prune()
            clock.lap("prune")
        except Exception as err:
            if self.rank == 0:
                shutil.rmtree(tmp, ignore_errors=True)  # free the space a partial save took
            else:  # rank 0 waits for this rank's part: tell it why there is none
                with contextlib.suppress(OSError):
                    (tmp / _FAILED.format(self.rank)).write_text(f"{type(err).__name__}: {err}"[:500])
            error = None if isinstance(err, CheckpointError) else save_error(err, final, tmp, self._kept())
            if error is None:
                raise
            raise error from err
        return final

    def _kept(self) -> list[str]:
        return [p.name for p in self.all(self.run_id)]

    def _folders(self, step: int) -> tuple[Path, Path]:
        """(final, temporary) folder of the checkpoint of `step`."""
        final = self.root / step_dir_name(step)
        name = f".tmp-{self.run_id}-{final.name}" if self.run_id else f".tmp-{final.name}"
        return final, self.root / name

    def _wait_for_ranks(self, tmp: Path, final: Path, world_size: int) -> None:
        """Until every other rank has marked its part done (files, not a collective: this may run beside
        training's collectives); a rank's failure, `abandon` or the timeout raise CheckpointError."""
        waiting = set(range(1, world_size))
        deadline = time.monotonic() + self.rank_timeout_s
        while waiting:
            for rank in sorted(waiting):
                failed = tmp / _FAILED.format(rank)
                if failed.is_file():
                    raise CheckpointError(
                        f"cannot write checkpoint {final}: rank {rank} could not write its part "
                        f"({failed.read_text().strip()}). The partial save was removed; earlier checkpoints "
                        "are intact."
                    )
                if (tmp / _DONE.format(rank)).is_file():
                    waiting.discard(rank)
            if waiting and (self.abandon.is_set() or time.monotonic() > deadline):
                why = "the run failed" if self.abandon.is_set() else f"within {self.rank_timeout_s:.0f} s"
                raise CheckpointError(
                    f"cannot write checkpoint {final}: rank(s) {', '.join(map(str, sorted(waiting)))} did not "
                    f"finish their part ({why}). The partial save was removed; earlier checkpoints are intact."
                )
            if waiting:
                time.sleep(0.02)
        for marker in tmp.glob(".done-rank*"):
            marker.unlink()

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
        _fsync(self.root)
        if old is not None:
            shutil.rmtree(old, ignore_errors=True)
        log.info("saved checkpoint %s", final)

    def _prune(self, keep: int | None = None, besides: Path | None = None) -> None:
        """Remove this run's checkpoints but the newest `keep` (keep_last), not counting `besides`."""
        mine = [p for p in self.all(self.run_id) if p != besides]
        for path in mine[: -(keep or self.keep_last)]:
            shutil.rmtree(path, ignore_errors=True)
            log.info("removed old checkpoint %s (checkpoint.keep_last=%d)", path, self.keep_last)

    @contextlib.contextmanager
    def _pruning_beside(self, final: Path) -> Iterator[None]:
        """While the block writes `final`, remove in a thread the checkpoints it will push past keep_last:
        the disk never holds more than keep_last of this run's checkpoints, and deleting a 20 GB folder
        (2.5-3 s on an H100 host: the filesystem frees its extents) runs beside the write, not after it. With
        keep_last=1 the old checkpoint stays until the new one is in place (`_prune` after the block)."""
        if self.keep_last < 2:
            yield
            return
        thread = threading.Thread(
            target=self._prune, args=(self.keep_last - 1, final), name="gr00t-train-prune", daemon=True
        )
        thread.start()
        try:
            yield
        finally:
            thread.join()

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


def _other_ranks_part(path: Path) -> bool:
    """A file another rank writes into the temporary folder (its state, or a marker), maybe still growing."""
    return path.name.startswith(".") or (path.name.startswith("rank") and path.name != rank_file_name(0))


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
