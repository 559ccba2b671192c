"""Whether a checkpoint can be resumed by this run, decided before the model is built (exit 2 otherwise).

A resume continues the checkpoint's run exactly: the same settings of everything that decides what the run
computes (`checkpoint.resume_changes`: data, model and trainable set, optimizer and schedule,
numerics; `--resume-changed KEY` allows a named change, which is recorded), the same dataset (its
fingerprint, even at the same path), the same optimizer-state form, and checkpoint files that unpickle as
plain tensors. Another world size is allowed (`checkpoint.resize`: the global batch changes, which a warning names and
the run records). Every refusal says how to continue instead: the checkpoint's values, or a new run from its
weights with a command that works as written."""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

import torch

from .._distributed import device_type
from .._errors import ConfigError
from .._schedule import CosineSchedule
from ..config.sections import TrainConfig
from ..data.fingerprint import differences, fingerprint, meta_digest, read_fingerprint
from ..data.mixture import mixture_fingerprint
from ..model.gr00t import merges_dit_linears
from .base import find_base
from .checkpointer import DATASET_FINGERPRINT, TRAIN_CONFIG, TRAINER_STATE
from .files import unreadable
from .resize import check_resize
from .resume_changes import Change, config_changes, unknown_keys
from .weights import read_record

log = logging.getLogger(__name__)


def fresh_run_advice(path: Path, cfg: TrainConfig) -> str:
    """How to train on from `path`'s weights as a new run (a fresh optimizer, schedule and data order)."""
    out = f"{cfg.output_dir.rstrip('/')}-from-{path.name}"
    sets = f"--set model.checkpoint={path} --set output_dir={out}"
    if cfg.checkpoint.dir:
        sets += f" --set checkpoint.dir={out}/checkpoints"
    return f"To train on from its weights as a new run instead, drop --resume and add {sets}"


def check_compatible(path: Path, cfg: TrainConfig, world_size: int) -> list[Change]:
    """Refuse (ConfigError) a resume of `path` that would not continue its run; returns the allowed changes
    (harmless ones and those named by checkpoint.resume_changed), which the caller logs and records."""
    state = json.loads((path / TRAINER_STATE).read_text())
    saved = _saved_config(path)
    fresh = fresh_run_advice(path, cfg)
    allowed = cfg.checkpoint.resume_changed or []
    unknown = unknown_keys(allowed)
    if unknown:
        raise ConfigError("checkpoint.resume_changed", f"{', '.join(unknown)}: not a setting (e.g. optim.lr)")
    _check_same_layout(path, cfg, fresh)  # first: no --resume-changed can allow it
    changes = config_changes(saved, cfg, device_type(cfg.device)) if saved else []
    _refuse_changes(path, changes, allowed, fresh)
    _check_schedule(path, cfg, state, changes, fresh)
    _check_same_dataset(path, cfg, state, fresh)
    _check_loadable(path, fresh)
    _check_base(path, cfg)
    if int(state.get("world_size", 1)) != world_size:  # after the refusals: a refused run warns of nothing
        global_batch = cfg.data.batch_size * cfg.optim.grad_accum * world_size
        check_resize(path, state, saved, cfg.optimizations.data, global_batch, world_size, fresh)
    _warn_other_cpu_threads(path, state.get("cpu_threads"))
    for change in changes:
        if change.kind == "trajectory":
            log.warning("resuming %s with %s (--resume-changed %s)", path, change.text(), change.key)
        else:
            log.info("resuming %s with %s (does not change what the run computes)", path, change.text())
    for name in allowed:
        if not any(c.key == name for c in changes):
            log.warning("--resume-changed %s: that setting is the same as in %s", name, path)
    return [c for c in changes if c.kind == "trajectory"]


def _refuse_changes(path: Path, changes: list[Change], allowed: list[str], fresh: str) -> None:
    layout = [c for c in changes if c.kind == "layout"]
    refused = [c for c in changes if c.kind == "trajectory" and c.key not in allowed]
    if layout:
        first = layout[0]
        raise ConfigError(
            first.key,
            f"{path} was written with {first.key}={first.before}, this run has {first.now}: its optimizer "
            f"state fits only the form it was saved from (ZeRO-1's own format). Resume with --set "
            f"{first.key}={first.before}. {fresh}",
        )
    if not refused:
        return
    listed = "; ".join(c.text() for c in refused)
    restore = " ".join(f"--set {c.key}={_as_arg(c.before)}" for c in refused)
    steps = (
        " A longer or shorter run continues the checkpoint's lr schedule only with --resume-changed steps."
        if any(c.key == "steps" for c in refused)
        else ""
    )
    raise ConfigError(
        refused[0].key if len(refused) == 1 else "checkpoint.resume",
        f"this run differs from {path} in what it computes ({listed}): a resume continues that run exactly. "
        f"Resume with the checkpoint's values ({restore}), or allow a change with --resume-changed KEY (it "
        f"is recorded in the run).{steps} {fresh}",
    )


def _check_schedule(
    path: Path, cfg: TrainConfig, state: dict[str, Any], changes: list[Change], fresh: str
) -> None:
    """A changed `steps` (allowed by --resume-changed) keeps the checkpoint's schedule: steps past its end
    train at its final lr, which must not be 0."""
    if not any(c.key == "steps" for c in changes) or "schedule" not in state:
        return
    schedule = CosineSchedule(**state["schedule"])
    if cfg.steps > schedule.total_steps and schedule.lr(schedule.total_steps) == 0:
        raise ConfigError(
            "steps",
            f"{path}'s lr schedule ends at step {schedule.total_steps} with lr 0 (optim.min_lr_ratio=0): the "
            f"steps up to {cfg.steps} would not train. {fresh}",
        )
    log.warning(
        "steps %d -> %d: the run continues %s's lr schedule (%d steps; later steps at its final lr %.3g)",
        schedule.total_steps, cfg.steps, path, schedule.total_steps, schedule.lr(schedule.total_steps),
    )  # fmt: skip


def _check_same_dataset(path: Path, cfg: TrainConfig, state: dict[str, Any], fresh: str) -> None:
    """The dataset the checkpoint recorded, at its path or moved: compared by content, not by path."""
    if cfg.data.mixture:
        _check_same_mixture(path, cfg, fresh)
        return
    now = cfg.data.dataset
    before = _dotted(_saved_config(path), "data.dataset")
    if not now:
        return
    moved = bool(before) and Path(before).resolve() != Path(now).resolve()
    recorded = read_fingerprint(path)
    found = fingerprint(now)
    if recorded is not None:
        what = differences(recorded, found)
    elif state.get(DATASET_FINGERPRINT) is not None:  # older checkpoints recorded meta/ only
        what = None if state[DATASET_FINGERPRINT] == meta_digest(found) else "its meta/ folder differs"
    else:
        what = "the checkpoint records no fingerprint of its dataset to compare with" if moved else None
    if what is None:
        if moved:
            log.warning("resuming %s on %s (written on %s): the same dataset, moved", path, now, before)
        return
    where = f"data.dataset={now} (the checkpoint was written on {before})" if moved else now
    raise ConfigError(
        "data.dataset",
        f"{where} is not the dataset {path} was trained on: {what}. Resuming continues the checkpoint's "
        f"position in that dataset's sample order and its normalization. Restore the dataset (or resume on "
        f"an unchanged copy). {fresh}",
    )


def _check_same_mixture(path: Path, cfg: TrainConfig, fresh: str) -> None:
    """Every data.mixture member's content as the checkpoint recorded it (the entries themselves, paths
    included, are compared as settings)."""
    recorded = read_fingerprint(path)
    if recorded is None:
        return  # a checkpoint of another kind of run: its config differs, which is refused on its own
    what = differences(recorded, mixture_fingerprint(cfg.data.mixture))
    if what is not None:
        raise ConfigError(
            "data.mixture",
            f"the datasets are not those {path} was trained on: {what}. Resuming continues the checkpoint's "
            f"position in the mixture's sample order and each dataset's normalization. Restore the datasets. "
            f"{fresh}",
        )


def _check_same_layout(path: Path, cfg: TrainConfig, fresh: str) -> None:
    """The DiT's merged linears change which parameters the optimizer state holds: a checkpoint resumes only
    in its own form (its model config records which ran). Its weights load into either (model.checkpoint)."""
    try:
        model_config = json.loads((path / "config.json").read_text()).get("config", {})
    except (OSError, ValueError, AttributeError):
        return
    saved = bool(model_config.get("merged_dit_linears", False))
    wanted = device_type(cfg.device)
    now = merges_dit_linears(cfg, wanted)
    if saved != now:
        flag = cfg.optimizations.merged_dit_linears
        raise ConfigError(
            "optimizations.merged_dit_linears",
            f"{path} was written with the DiT's linears {'merged' if saved else 'unmerged'}; this run has "
            f"optimizations.merged_dit_linears={flag}, which on {wanted} {'merges' if now else 'does not merge'} "
            "them, and the optimizer state fits only the form it was saved from. Resume with --set "
            f"optimizations.merged_dit_linears={'on' if saved else 'off'}. {fresh}",
        )


def _check_base(path: Path, cfg: TrainConfig) -> None:
    """A checkpoint that records a base (`checkpoint/weights.py`) holds only what training changed: the run must build
    its model from that base, unchanged (model.checkpoint, at the recorded path or moved)."""
    try:
        record = read_record(path)
    except ValueError as err:
        raise ConfigError("checkpoint.resume", f"{err}; resume from another checkpoint") from None
    base = (record or {}).get("base")
    if base is None:
        return
    recorded = base["path"]
    if not cfg.model.checkpoint:
        raise ConfigError(
            "model.checkpoint",
            f"is not set, but {path} holds only what training changed: its frozen weights are those of its "
            f"base {recorded} (recorded by path and SHA-256). Resume with --set model.checkpoint={recorded}",
        )
    _, reason = find_base(base, cfg.model.checkpoint)
    if reason is None:
        return
    intact = Path(cfg.model.checkpoint).resolve() != Path(recorded).resolve() and find_base(base)[1] is None
    advice = (
        f"The recorded base is intact: resume with --set model.checkpoint={recorded}"
        if intact
        else "Restore the base (or pass its new place with --set model.checkpoint=DIR)"
    )
    raise ConfigError(
        "model.checkpoint",
        f"{path}'s frozen weights are those of its base {recorded} (recorded by path and SHA-256), but "
        f"{reason}. {advice}",
    )


def _check_loadable(path: Path, fresh: str) -> None:
    """The checkpoint's pickled files hold only tensors and plain containers (memory-mapped: the pickle is
    read, the tensor data is not). Anything else is refused here, not after the model was built."""
    for file in sorted(path.glob("*.pt")):
        try:
            torch.load(file, map_location="cpu", weights_only=True, mmap=True)
        except Exception as err:  # noqa: BLE001 - any failure to unpickle is a refusal
            raise ConfigError("checkpoint.resume", unreadable(file, err) + f" {fresh}") from None


def _warn_other_cpu_threads(path: Path, saved: int | None) -> None:
    """A CPU run's checkpoint resumed with another number of compute threads continues, but not bit for bit:
    torch's CPU kernels split reductions by thread (the count is cores - data.num_workers, see
    `share_cpu_cores`)."""
    now = torch.get_num_threads()
    if saved is not None and saved != now:
        log.warning(
            "resuming %s written with %d CPU compute threads, now %d: the run continues but does not follow "
            "the original trajectory bit for bit (CPU kernels sum in a thread-dependent order); keep "
            "data.num_workers and the core count to resume exactly",
            path,
            saved,
            now,
        )


def _as_arg(value: Any) -> str:
    if isinstance(value, (list, tuple)):
        return ",".join(map(str, value))
    return "none" if value is None else str(value).lower() if isinstance(value, bool) else str(value)


def _saved_config(path: Path) -> dict[str, Any]:
    try:
        data = json.loads((path / TRAIN_CONFIG).read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def _dotted(data: dict[str, Any], name: str) -> Any:
    node: Any = data
    for part in name.split("."):
        if not isinstance(node, dict) or part not in node:
            return None
        node = node[part]
    return node
