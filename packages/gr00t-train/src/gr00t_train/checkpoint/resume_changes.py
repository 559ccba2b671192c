"""Which settings a resume may change. A resume continues the checkpoint's run exactly, so a setting that
changes what the run computes (data, model, optimizer, schedule, numerics) must stay as the checkpoint
recorded it, unless the user names it with `--resume-changed KEY`; settings that change only how fast or
how visibly it runs (logging, checkpoint cadence, workers, exact speed switches) may change freely; and
a few change the optimizer state's form, which only its own form can load."""

from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Any

import torch

from .._errors import ConfigError
from ..config.io import config_from_dict, config_to_dict
from ..config.optimizations import resolve_optimizations
from ..config.sections import TrainConfig

HARMLESS = (
    "output_dir", "device", "model.checkpoint", "checkpoint.", "logging.", "eval.", "memory.recompute",
    "memory.recompute_policy", "memory.budget_gib",  # what it changes (microbatch, accumulation, moments) is compared itself
    "data.dataset",  # the path: the dataset itself is compared by its fingerprint
    "data.num_workers", "data.prefetch", "data.worker_timeout_s", "data.max_bad_fraction",
    "data.decode_device", "data.augment_backend", "data.prefix_cache.dir", "data.prefix_cache.build_batch_size",
    "optimizations.data", "optimizations.graph", "optimizations.compile", "optimizations.compile_cache",
    "optimizations.fused_optimizer",
    "optimizations.cudnn_benchmark", "optimizations.gemm_workspace", "optimizations.bucket_mib",
    "optimizations.graph_warmup", "optimizations.flat_optimizer", "optimizations.triton_attention",
    "optimizations.weight_grads_in_place", "optimizations.grouped_embodiment_gemms",
    "optimizations.skip_untouched_rows", "optimizations.optimizer_overlap", "optimizations.staged_update",
    "optimizations.sync_in_graph", "optimizations.bf16_weights", "optimizations.merged_dit_linears",
)  # fmt: skip
"""Settings (or section prefixes) that change how fast or how visibly the run goes, not what it computes."""
LAYOUT = {
    "optimizations.comm": "ZeRO-1 (comm=zero1_overlap) keeps its optimizer state in a format of its own"
}
"""Settings whose change the checkpoint's optimizer state cannot follow, with the reason. (The DiT's merged
linears are checked from the checkpoint's model config, which records what ran: `checkpoint.resume_checks`.)"""
LEGACY = {"data.val_episodes": 0}
"""Settings checkpoints did not record before they existed, and the value that reproduces those runs."""
_MODEL_DEFAULTS = ("action_horizon", "tune_llm", "tune_visual", "tune_top_llm_layers")
"""Model settings whose None means the preset's value: compared as that value."""


@dataclass
class Change:
    """One setting that differs between a checkpoint's run and this run."""

    key: str
    before: Any
    now: Any
    kind: str
    """harmless, trajectory (allowed by --resume-changed) or layout (never)."""

    def text(self) -> str:
        return f"{self.key} {_show(self.before)} -> {_show(self.now)}"


def config_changes(saved: dict[str, Any], cfg: TrainConfig, device: str | torch.device) -> list[Change]:
    """The settings of `cfg` (resolved for `device`) that differ from a checkpoint's recorded config (the
    `train_config.json` dict), each classified. Settings the checkpoint did not record are not compared,
    except those in LEGACY."""
    before = _comparable(saved, device)
    now = _flatten(_with_model_defaults(config_to_dict(resolve_optimizations(cfg, device)[0])))
    recorded = _flatten(saved)
    changes = []
    for key, value in now.items():
        if key not in recorded and key not in LEGACY:
            continue
        old = before.get(key, LEGACY.get(key))
        if _same(old, value):
            continue
        changes.append(Change(key, old, value, _kind(key, old, value)))
    return changes


def unknown_keys(names: list[str] | None) -> list[str]:
    """The names of `checkpoint.resume_changed` that are not settings."""
    known = _flatten(config_to_dict(TrainConfig()))
    return [name for name in names or [] if name not in known]


def _kind(key: str, before: Any, now: Any) -> str:
    if key == "optimizations.comm":  # only the move into or out of ZeRO-1 changes the state's format
        return "layout" if (before == "zero1_overlap") != (now == "zero1_overlap") else "harmless"
    if key in LAYOUT:
        return "layout"
    if any(key == h or (h.endswith(".") and key.startswith(h)) for h in HARMLESS):
        return "harmless"
    return "trajectory"


def _comparable(saved: dict[str, Any], device: str | torch.device) -> dict[str, Any]:
    """A checkpoint's config as this version reads and resolves it (former names, true/false switches,
    `auto` as it resolves on `device`), flattened; the raw values where it cannot be read so."""
    try:
        cfg = config_from_dict(TrainConfig, copy.deepcopy(saved))
        data = config_to_dict(resolve_optimizations(cfg, device)[0])
    except (ConfigError, ValueError, TypeError):
        data = saved
    return _flatten(_with_model_defaults(data))


def _with_model_defaults(data: dict[str, Any]) -> dict[str, Any]:
    """Model settings left to the preset (None) as the preset has them, so None and its value compare equal."""
    model = data.get("model")
    if not isinstance(model, dict):
        return data
    try:
        from gr00t_model import GR00TConfig

        preset = GR00TConfig.preset(model.get("preset", ""))
    except (ValueError, ImportError):
        return data
    filled = {**model, **{k: getattr(preset, k) for k in _MODEL_DEFAULTS if model.get(k) is None}}
    return {**data, "model": filled}


def _flatten(data: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in data.items():
        if isinstance(value, dict):
            out.update(_flatten(value, f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = value
    return out


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    if isinstance(a, (int, float)) and isinstance(b, (int, float)) and not isinstance(a, bool):
        return float(a) == float(b)
    return a == b


def _show(value: Any) -> str:
    if isinstance(value, (list, tuple)):
        return "[" + ",".join(map(str, value)) + "]"
    return "none" if value is None else str(value)


def as_records(changes: list[Change], step: int) -> list[dict[str, Any]]:
    """JSON records of allowed changes at a resume (what checkpoints and summary.json keep)."""
    return [{"step": step, "key": c.key, "from": c.before, "to": c.now} for c in changes]
