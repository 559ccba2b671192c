"""Whether a checkpoint can be resumed by this run: the same world size, per-device batch, seed, shuffling
and dataset (a resume continues the exact trajectory) and the same parameter layout (the optimizer state is
per parameter), checked before the model is built (exit 2 otherwise)."""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

import torch

from ._checkpoint import DATASET_FINGERPRINT, TRAIN_CONFIG, TRAINER_STATE, dataset_fingerprint
from ._config import TrainConfig
from ._distributed import device_type
from ._errors import ConfigError
from ._gr00t import merges_dit_linears

log = logging.getLogger(__name__)


def check_compatible(path: Path, cfg: TrainConfig, world_size: int) -> None:
    """A resume continues the exact trajectory: same world size, per-device batch, seed, shuffling and
    dataset, or exit 2 now (before the model is built)."""
    state = json.loads((path / TRAINER_STATE).read_text())
    saved_world = int(state.get("world_size", 1))
    saved = _saved_config(path)
    saved_batch = _dotted(saved, "data.batch_size")
    batch = cfg.data.batch_size
    if saved_world != world_size or (saved_batch is not None and saved_batch != batch):
        raise ConfigError(
            "checkpoint.resume",
            f"{path} was written by {saved_world} process(es) with data.batch_size={saved_batch}; this run "
            f"has {world_size} process(es) and data.batch_size={batch}. Resuming continues the exact data "
            "order and random streams of every rank, so both must match. To train on from these weights "
            f"with a fresh optimizer and data order, start a new run with --set model.checkpoint={path}",
        )
    fresh = f"To train on from these weights with a fresh data order, start a new run with --set model.checkpoint={path}"
    for name, now in (("seed", cfg.seed), ("data.shuffle", cfg.data.shuffle)):
        before = _dotted(saved, name)
        if before is not None and before != now:
            raise ConfigError(
                name,
                f"{path} was written with {name}={before}, this run has {name}={now}. Resuming continues "
                f"the checkpoint's data order and random streams, which {name} decides: resume with "
                f"--set {name}={before}. {fresh}",
            )
    _check_same_dataset(path, cfg, state, _dotted(saved, "data.dataset"), fresh)
    _check_same_layout(path, cfg)
    _warn_other_cpu_threads(path, state.get("cpu_threads"))
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


def _check_same_dataset(path: Path, cfg: TrainConfig, state: dict[str, Any], before: Any, fresh: str) -> None:
    """The same dataset path, or a dataset whose meta/ folder is the one the checkpoint recorded (a moved or
    copied dataset); anything else stops the run naming both paths."""
    now = cfg.data.dataset
    if not before or not now or Path(before).resolve() == Path(now).resolve():
        return
    recorded = state.get(DATASET_FINGERPRINT)
    if recorded is not None and recorded == dataset_fingerprint(now):
        log.warning(
            "resuming %s on %s: the checkpoint was written on %s; their metadata (meta/) is identical, so "
            "the run continues on it",
            path,
            now,
            before,
        )
        return
    why = (
        "its meta/ folder differs from the one the checkpoint recorded"
        if recorded is not None
        else "the checkpoint records no fingerprint of its dataset to compare with"
    )
    raise ConfigError(
        "data.dataset",
        f"{path} was written with data.dataset={before}, this run has data.dataset={now} ({why}). Resuming "
        f"continues the checkpoint's position in its dataset's sample order. If {before} still holds that "
        f"dataset, resume with --set data.dataset={before}; if {now} is a copy, copy it whole (meta/ "
        f"included) or resume from the old path. {fresh}",
    )


def _check_same_layout(path: Path, cfg: TrainConfig) -> None:
    """The DiT's merged linears (optimizations.merged_dit_linears) change which parameters the optimizer
    state holds: a checkpoint resumes only in its own form. Its weights load into either (model.checkpoint)."""
    try:  # the model's config, as gr00t_model's save_pretrained wrote it; absent before the merged form
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
            f"optimizations.merged_dit_linears={'on' if saved else 'off'}. To train on from these weights "
            f"(they load into either form) with a fresh optimizer, start a new run with --set "
            f"model.checkpoint={path}",
        )


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
