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

from .._distributed import DistEnv
from .._errors import ConfigError, RunFolderError
from ..checkpoint.checkpointer import (
    Checkpointer,
    checkpoint_run_id,
    verify_checkpoint,
)
from ..checkpoint.resume_checks import check_compatible
from ..config.sections import TrainConfig
from ..model.compile_cache import AUTO_FILE
from .checks import probe_writable, refuse_dataset_folder, refuse_inside_live_run, refuse_nested_runs
from .lock import FolderLock

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
    AUTO_FILE,
)
"""What a run writes into its output_dir besides checkpoints (moved or deleted together; the compile cache
too, so a run started afresh with --overwrite compiles as a first run does)."""
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
    """Lock output_dir (and checkpoint.dir when it lies elsewhere), then refuse when another live run holds
    a folder above or below either of them (a run whose output_dir or checkpoint.dir is a live run's
    checkpoints folder, or the other way round): its files would be ours to prune, move or delete. Locking
    first and looking second means that of two runs starting at once at least one sees the other."""
    out = Path(cfg.output_dir)
    checkpoints = Path(cfg.checkpoint_dir)
    inside = checkpoints.resolve().is_relative_to(out.resolve())
    folders = [(out, "output_dir"), (checkpoints, "checkpoint.dir")]
    refuse_dataset_folder(cfg, folders)
    for folder, setting in folders:  # refused before its lock file is written into a live run's folder
        if not (folder is checkpoints and inside):  # inside output_dir: its lock answers for both
            refuse_inside_live_run(folder, setting)
    locks: list[FolderLock] = []
    try:
        for folder, setting in folders:
            if folder is checkpoints and inside:  # output_dir's lock covers it
                if folder.exists() or folder.is_symlink():
                    if not folder.is_dir():
                        raise RunFolderError(
                            setting, f"{folder} is a file, not a folder; choose another {setting}"
                        )
                    probe_writable(folder, setting)
                continue
            locks.append(FolderLock.acquire(folder, setting))
            probe_writable(folder, setting)
        for folder, setting in folders:
            refuse_nested_runs(folder, setting)
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
    if resume and recorded == _UNNAMED:
        recorded = _adopt_logs(out, ck)
    if not resume:
        run_id: str | None = new_run_id()
    elif resume == "auto":
        run_id, resume_from = _resume_auto(ck, recorded)
    else:
        resume_from = Path(resume)
        reason = verify_checkpoint(resume_from)
        if reason is not None:
            raise ConfigError(
                "checkpoint.resume",
                f"{resume_from} cannot be resumed from: {reason}{_available(resume_from)}",
            )
        run_id = checkpoint_run_id(resume_from)
    if resume_from is not None:
        check_compatible(resume_from, cfg, world_size)
    others = _other_runs(out, ck, run_id, recorded, resuming=bool(resume))
    if others:
        _settle(others, cfg, out, ck)
    _write_run_file(out, run_id, resume_from)
    return run_id, resume_from


def _adopt_logs(out: Path, ck: Checkpointer) -> str:
    """--resume into a folder whose run.json was lost: its logs belong to the run of its checkpoints when
    they are all of one run; otherwise they stay unnamed (and are taken as this run's, see _other_runs)."""
    ids = {checkpoint_run_id(p) for p in ck.all()}
    if len(ids) == 1 and None not in ids:
        (run,) = ids
        log.warning(
            "%s has no readable %s: its logs are taken as those of run %s, whose checkpoints are in %s",
            out,
            RUN_FILE,
            run,
            ck.root,
        )
        return run
    return _UNNAMED


def _available(path: Path) -> str:
    """`; <folder> holds step_...` for a --resume path that is not a checkpoint (a typo in the step)."""
    names = [p.name for p in Checkpointer(path.parent, keep_last=1).all()]
    if not names:
        return ""
    shown = ", ".join(names[-5:])
    return f"; {path.parent} holds {shown} (pass one of them, or --resume alone for the newest intact one)"


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
    out: Path, ck: Checkpointer, run_id: str | None, recorded: str | None, resuming: bool = False
) -> dict[str, list[Path]]:
    """Files of runs other than `run_id`: {run id: checkpoint folders (+ output files under key '')}. When
    resuming, files without a run id (logs whose run.json was lost, checkpoints from before run ids) are
    this run's."""
    mine = run_id or _UNNAMED
    found: dict[str, list[Path]] = {}
    for path in ck.all():
        owner = checkpoint_run_id(path) or _UNNAMED
        if owner != mine and not (resuming and owner == _UNNAMED):
            found.setdefault(owner, []).append(path)
    if recorded is not None and recorded != mine and not (resuming and recorded == _UNNAMED):
        found.setdefault(recorded, [])
    return found


def _settle(others: dict[str, list[Path]], cfg: TrainConfig, out: Path, ck: Checkpointer) -> None:
    policy = cfg.checkpoint.existing_run
    described = "; ".join(_describe(run, paths) for run, paths in sorted(others.items()))
    if policy == "error":
        if cfg.checkpoint.resume:  # never ask for the flag already given
            raise RunFolderError(
                "output_dir",
                f"{out} holds another run besides the one being resumed ({described}). Add --new-run to "
                f"keep it (moved to {out / ARCHIVE}/<run id>/) or --overwrite to delete it, or resume in "
                "a folder of its own",
            )
        raise RunFolderError(
            "output_dir",
            f"{out} holds another run ({described}). Pass --resume to continue it, --new-run to start "
            f"afresh and keep it (moved to {out / ARCHIVE}/<run id>/), --overwrite to delete it, or choose "
            "another output_dir",
        )
    outputs = [out / name for name in RUN_OUTPUTS if (out / name).exists()]
    recorded = _recorded_run(out)
    plan = []
    for run, paths in others.items():
        partial = [p for p in ck.root.glob(f".tmp-{run}-*")] if run != _UNNAMED else []
        plan.append((run, paths, partial, outputs if run == recorded else []))
    doomed = [p for _, paths, partial, files in plan for p in (*paths, *partial, *files)]
    _keep_initial_weights(cfg, doomed, policy)
    _check_removable(doomed, policy)
    for run, paths, partial, files in plan:
        try:
            if policy == "overwrite":
                doomed = paths + partial + files
                log.warning(
                    "checkpoint.existing_run=overwrite: deleting run %s (%d files/folders)", run, len(doomed)
                )
                for path in doomed:
                    shutil.rmtree(path) if path.is_dir() else path.unlink()
            else:
                _archive(run, paths + partial, files, out, ck.root)
        except OSError as err:
            raise RunFolderError(
                "output_dir",
                f"cannot {'delete' if policy == 'overwrite' else 'move'} run {run}'s files: {err.strerror} "
                f"({err.filename}); some of them may be left in place",
            ) from None


def _keep_initial_weights(cfg: TrainConfig, paths: list[Path], policy: str) -> None:
    """Refuse to move or delete the checkpoint this run starts from (model.checkpoint): it would be gone
    before the model is loaded from it."""
    if not cfg.model.checkpoint:
        return
    start = Path(cfg.model.checkpoint).resolve()
    for path in paths:
        if start == path.resolve() or start.is_relative_to(path.resolve()):
            verb = "delete" if policy == "overwrite" else "move to " + str(Path(cfg.output_dir) / ARCHIVE)
            raise RunFolderError(
                "model.checkpoint",
                f"{cfg.model.checkpoint} belongs to the run that --{policy.replace('_', '-')} would {verb}, "
                f"so it would be gone before this run loads it. Start the new run in another folder: "
                f"--set output_dir={cfg.output_dir.rstrip('/')}-from-{start.name}",
            )


def _check_removable(paths: list[Path], policy: str) -> None:
    """Refuse --overwrite / --new-run before touching anything when a file of the other run cannot be
    deleted or moved (a read-only folder): half-deleted runs help nobody."""
    for path in paths:
        folders = [path.parent]
        if policy == "overwrite" and path.is_dir() and not path.is_symlink():
            folders += [Path(root) for root, _, _ in os.walk(path)]
        for folder in folders:
            if not os.access(folder, os.W_OK | os.X_OK):
                verb = "delete" if policy == "overwrite" else "move"
                raise RunFolderError(
                    "output_dir",
                    f"cannot {verb} {path}: {folder} is not writable. Make it writable, or choose another "
                    "output_dir",
                )


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
    try:
        tmp.write_text(json.dumps(record, indent=2) + "\n")
        os.replace(tmp, out / RUN_FILE)
    except OSError as err:
        tmp.unlink(missing_ok=True)  # no half-written file left behind
        raise OSError(err.errno, err.strerror, str(out / RUN_FILE)) from None
