"""Who owns an output folder: a lock per folder (a second live run exits 2 naming the holder), an id per run
(recorded in `run.json` and in every checkpoint), the decision what to resume from (the newest intact
checkpoint, skipping damaged ones), and what happens to another run's files (an error unless the user
asks for a new run, which moves them to `previous-runs/<id>/`, or to overwrite them).

Everything here runs on rank 0 before the model and the data are built; the decision is broadcast, so every
rank resumes from the same checkpoint or raises the same error. Claims are re-entrant within a process:
`run_training` claims before building, `Trainer.fit` gets the same claim back.
"""

from __future__ import annotations

import json
import logging
import os
import secrets
import shutil
import socket
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ._checkpoint import TRAIN_CONFIG, TRAINER_STATE, Checkpointer, checkpoint_run_id, verify_checkpoint
from ._config import TrainConfig
from ._distributed import DistEnv
from ._errors import ConfigError, RunFolderError
from ._folder_lock import FolderLock

log = logging.getLogger(__name__)

RUN_FILE = "run.json"
ARCHIVE = "previous-runs"
RUN_OUTPUTS = (
    "run.json",
    "metrics.jsonl",
    "summary.json",
    "config.json",
    "loss.png",
    "step_time.png",
    "tensorboard",
)
"""What a run writes into its output_dir besides checkpoints (moved or deleted together)."""
_UNNAMED = "unnamed"  # a run written before runs had ids


def new_run_id() -> str:
    """A fresh, sortable run id: start time plus a random suffix."""
    return time.strftime("%Y%m%d-%H%M%S") + "-" + secrets.token_hex(3)


@dataclass
class RunClaim:
    """This process's hold on a run folder."""

    run_id: str | None
    """None: continuing a run written before runs had ids."""
    resume_from: Path | None
    key: Path
    locks: list[FolderLock] = field(default_factory=list)
    users: int = 1

    def release(self) -> None:
        """Drop one user; the last one unlocks the folders."""
        self.users -= 1
        if self.users == 0:
            for lock in self.locks:
                lock.release()
            _HELD.pop(self.key, None)


_HELD: dict[Path, RunClaim] = {}


def claim_run(cfg: TrainConfig, env: DistEnv) -> RunClaim:
    """Lock the run's folders, settle other runs' files and choose the checkpoint to resume from."""
    key = Path(cfg.output_dir).resolve()
    held = _HELD.get(key)
    if held is not None:
        held.users += 1
        return held
    locks: list[FolderLock] = []
    failure: Exception | None = None
    outcome: tuple[Any, ...] = ()
    if env.is_main:
        try:
            locks = _lock_folders(cfg)
            run_id, resume_from = _decide(cfg, env.world_size)
            outcome = ("ok", run_id, str(resume_from) if resume_from else None)
        except Exception as err:  # every rank must hear of it, or the others wait here forever
            for lock in locks:
                lock.release()
            failure = err
            reason = err.reason if isinstance(err, ConfigError) else f"{type(err).__name__}: {err}"
            outcome = ("error", type(err).__name__, getattr(err, "field", ""), reason)
    outcome = env.broadcast_object(outcome)
    if outcome[0] == "error":
        if failure is not None:
            raise failure
        kinds = {RunFolderError.__name__: RunFolderError, ConfigError.__name__: ConfigError}
        if outcome[1] in kinds:
            raise kinds[outcome[1]](outcome[2], outcome[3])
        raise RuntimeError(f"rank 0 could not claim {cfg.output_dir}: {outcome[3]}")
    claim = RunClaim(outcome[1], Path(outcome[2]) if outcome[2] else None, key, locks)
    _HELD[key] = claim
    return claim


def _lock_folders(cfg: TrainConfig) -> list[FolderLock]:
    out = Path(cfg.output_dir)
    checkpoints = Path(cfg.checkpoint_dir)
    folders = [out]
    if not checkpoints.resolve().is_relative_to(out.resolve()):
        folders.append(checkpoints)  # a shared checkpoint.dir is claimed too
    locks = []
    try:
        for folder in folders:
            locks.append(
                FolderLock.acquire(folder, "checkpoint.dir" if folder is checkpoints else "output_dir")
            )
    except BaseException:
        for lock in locks:
            lock.release()
        raise
    return locks


def _decide(cfg: TrainConfig, world_size: int) -> tuple[str | None, Path | None]:
    """(run id, checkpoint to resume from); handles other runs' files as `checkpoint.existing_run` says."""
    out = Path(cfg.output_dir)
    ck = Checkpointer(cfg.checkpoint_dir, cfg.checkpoint.keep_last)
    recorded = _recorded_run(out)
    resume = cfg.checkpoint.resume
    resume_from = None
    if not resume:
        run_id: str | None = new_run_id()
    elif resume == "auto":
        run_id, resume_from = _resume_auto(ck, recorded)
    else:
        resume_from = Path(resume)
        reason = verify_checkpoint(resume_from)
        if reason is not None:
            raise ConfigError("checkpoint.resume", f"{resume_from} cannot be resumed from: {reason}")
        run_id = checkpoint_run_id(resume_from)
    if resume_from is not None:
        _check_compatible(resume_from, cfg, world_size)
    others = _other_runs(out, ck, run_id, recorded)
    if others:
        _settle(others, cfg, out, ck)
    _write_run_file(out, run_id, resume_from)
    return run_id, resume_from


def _resume_auto(ck: Checkpointer, recorded: str | None) -> tuple[str | None, Path | None]:
    ids = {checkpoint_run_id(p) for p in ck.all()}
    if recorded is None and len(ids) > 1:
        names = ", ".join(sorted(i or _UNNAMED for i in ids))
        raise RunFolderError(
            "checkpoint.resume",
            f"{ck.root} holds checkpoints of {len(ids)} runs ({names}); pass --resume CHECKPOINT_FOLDER",
        )
    owner = recorded if recorded is not None else (next(iter(ids)) if ids else None)
    path, skipped = ck.newest_intact(None if owner == _UNNAMED else owner)
    for line in skipped:
        log.warning("%s", line)
    if path is None and skipped:
        raise ConfigError(
            "checkpoint.resume", f"no intact checkpoint in {ck.root} to resume from: " + "; ".join(skipped)
        )
    if path is None:
        log.info("checkpoint.resume=auto: no checkpoint in %s yet, starting fresh", ck.root)
        return (recorded if recorded != _UNNAMED else None) or new_run_id(), None
    if skipped:
        log.warning("resuming from %s, the newest intact checkpoint", path)
    return checkpoint_run_id(path), path


def _check_compatible(path: Path, cfg: TrainConfig, world_size: int) -> None:
    """A resume continues the exact trajectory: same world size and per-device batch, or exit 2 now."""
    state = json.loads((path / TRAINER_STATE).read_text())
    saved_world = int(state.get("world_size", 1))
    saved_batch = _saved_batch_size(path)
    batch = cfg.data.batch_size
    if saved_world != world_size or (saved_batch is not None and saved_batch != batch):
        raise ConfigError(
            "checkpoint.resume",
            f"{path} was written by {saved_world} process(es) with data.batch_size={saved_batch}; this run "
            f"has {world_size} process(es) and data.batch_size={batch}. Resuming continues the exact data "
            "order and random streams of every rank, so both must match. To train on from these weights "
            f"with a fresh optimizer and data order, start a new run with --set model.checkpoint={path}",
        )
    saved_global = state.get("global_batch")
    now_global = batch * cfg.optim.grad_accum * world_size
    if saved_global is not None and saved_global != now_global:
        log.warning(
            "resuming %s written with a global batch of %s, now %d (optim.grad_accum changed): the run "
            "continues but does not follow the original trajectory",
            path,
            saved_global,
            now_global,
        )


def _saved_batch_size(path: Path) -> int | None:
    try:
        return int(json.loads((path / TRAIN_CONFIG).read_text())["data"]["batch_size"])
    except (OSError, ValueError, KeyError, TypeError):
        return None


# ------------------------------------------------------------------------------------ other runs' files
def _recorded_run(out: Path) -> str | None:
    """The run whose logs output_dir holds (from run.json; `unnamed` for a run without an id), or None when
    nothing was logged there (a run that failed at its start leaves nothing worth keeping)."""
    metrics = out / "metrics.jsonl"
    if not (metrics.is_file() and metrics.stat().st_size > 0):
        return None
    try:
        return json.loads((out / RUN_FILE).read_text())["run_id"] or _UNNAMED
    except (OSError, ValueError, KeyError, TypeError):
        return _UNNAMED


def _other_runs(
    out: Path, ck: Checkpointer, run_id: str | None, recorded: str | None
) -> dict[str, list[Path]]:
    """Files of runs other than `run_id`: {run id: checkpoint folders (+ output files under key '')}."""
    mine = run_id or _UNNAMED
    found: dict[str, list[Path]] = {}
    for path in ck.all():
        owner = checkpoint_run_id(path) or _UNNAMED
        if owner != mine:
            found.setdefault(owner, []).append(path)
    if recorded is not None and recorded != mine:
        found.setdefault(recorded, [])
    return found


def _settle(others: dict[str, list[Path]], cfg: TrainConfig, out: Path, ck: Checkpointer) -> None:
    policy = cfg.checkpoint.existing_run
    described = "; ".join(_describe(run, paths) for run, paths in sorted(others.items()))
    if policy == "error":
        raise RunFolderError(
            "output_dir",
            f"{out} holds another run ({described}). Pass --resume to continue it, --new-run to start "
            f"afresh and keep it (moved to {out / ARCHIVE}/<run id>/), --overwrite to delete it, or choose "
            "another output_dir",
        )
    outputs = [out / name for name in RUN_OUTPUTS if (out / name).exists()]
    recorded = _recorded_run(out)
    for run, paths in others.items():
        partial = [p for p in ck.root.glob(f".tmp-{run}-*")] if run != _UNNAMED else []
        files = paths + partial + (outputs if run == recorded else [])
        if policy == "overwrite":
            log.warning(
                "checkpoint.existing_run=overwrite: deleting run %s (%d files/folders)", run, len(files)
            )
            for path in files:
                shutil.rmtree(path) if path.is_dir() else path.unlink()
        else:
            _archive(run, paths + partial, outputs if run == recorded else [], out, ck.root)


def _archive(run: str, checkpoints: list[Path], outputs: list[Path], out: Path, ck_root: Path) -> None:
    dest = out / ARCHIVE / (run if run != _UNNAMED else f"{_UNNAMED}-{time.strftime('%Y%m%d-%H%M%S')}")
    dest.mkdir(parents=True, exist_ok=True)
    for path in outputs:
        os.replace(path, dest / path.name)
    for path in checkpoints:
        target = dest / "checkpoints"
        try:
            target.mkdir(exist_ok=True)
            os.replace(path, target / path.name)
        except OSError:  # another file system: keep them beside the checkpoint folder instead
            target = ck_root / ARCHIVE / dest.name
            target.mkdir(parents=True, exist_ok=True)
            os.replace(path, target / path.name)
    log.warning("checkpoint.existing_run=new_run: moved run %s to %s", run, dest)


def _describe(run: str, paths: list[Path]) -> str:
    if not paths:
        return f"run {run}: logs, no checkpoints"
    steps = [p.name for p in paths]
    return (
        f"run {run}: {len(paths)} checkpoint(s) {steps[0]}..{steps[-1]}"
        if len(steps) > 1
        else f"run {run}: {steps[0]}"
    )


def _write_run_file(out: Path, run_id: str | None, resume_from: Path | None) -> None:
    out.mkdir(parents=True, exist_ok=True)
    record = {
        "run_id": run_id,
        "host": socket.gethostname(),
        "pid": os.getpid(),
        "started": time.strftime("%Y-%m-%d %H:%M:%S"),
        "resumed_from": str(resume_from) if resume_from else None,
    }
    tmp = out / f".{RUN_FILE}.tmp"
    tmp.write_text(json.dumps(record, indent=2) + "\n")
    os.replace(tmp, out / RUN_FILE)
