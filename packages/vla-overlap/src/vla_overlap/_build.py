"""One entry point per communication mode, so a training loop can switch modes with a string."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from ._config import OverlapConfig
from ._optimizer import DistributedAdamW
from ._wrapper import OverlapDataParallel

COMM_MODES = ("allreduce_after_backward", "ddp", "overlap", "zero1_overlap")
"""allreduce_after_backward: our buffers, every bucket reduced after backward (the baseline);
ddp: torch.nn.parallel.DistributedDataParallel; overlap: bucket reductions overlapped with backward;
zero1_overlap: overlap plus DistributedAdamW (sharded optimizer, parameter gathers prefetched in forward)."""


def build_data_parallel(
    module: nn.Module,
    mode: str,
    *,
    params: Iterable[nn.Parameter] | Iterable[dict[str, Any]] | None = None,
    lr: float = 1e-3,
    betas: tuple[float, float] = (0.9, 0.999),
    eps: float = 1e-8,
    weight_decay: float = 1e-2,
    fused: bool | None = None,
    foreach: bool | None = None,
    config: OverlapConfig | None = None,
    process_group: dist.ProcessGroup | None = None,
) -> tuple[nn.Module, torch.optim.Optimizer]:
    """Wrap `module` for data parallelism in `mode` (one of COMM_MODES) and build its AdamW.

    `params` are the optimizer's parameters or groups, taken from `module` (default: every trainable one).
    All modes then follow one protocol: `model.zero_grad()` before a step, `with model.no_sync():` around
    every backward but the last of the step, `clip_grad_norm_(model, optimizer, max_norm)`, `optimizer.step()`.
    """
    if mode not in COMM_MODES:
        raise ValueError(f"mode must be one of {COMM_MODES}, got {mode!r}")
    config = config if config is not None else OverlapConfig()
    if params is None:
        params = [p for p in module.parameters() if p.requires_grad]
    adamw = dict(lr=lr, betas=betas, eps=eps, weight_decay=weight_decay, fused=fused, foreach=foreach)
    if mode == "ddp":
        device = next(module.parameters()).device
        ids = [device] if device.type == "cuda" else None
        model: nn.Module = nn.parallel.DistributedDataParallel(
            module, device_ids=ids, process_group=process_group
        )
        return model, torch.optim.AdamW(params, **adamw)
    if mode == "allreduce_after_backward":
        config = dataclasses.replace(config, overlap_grad_reduce=False)
    wrapped = OverlapDataParallel(module, config, process_group=process_group)
    if mode == "zero1_overlap":
        return wrapped, DistributedAdamW(wrapped, params, **adamw)
    return wrapped, torch.optim.AdamW(params, **adamw)


def clip_grad_norm_(
    model: nn.Module, optimizer: torch.optim.Optimizer, max_norm: float, norm_type: float = 2.0
) -> torch.Tensor:
    """Clip gradients to a global norm in any mode; returns the norm before clipping."""
    if isinstance(optimizer, DistributedAdamW):
        return optimizer.clip_grad_norm_(max_norm, norm_type)
    if isinstance(model, OverlapDataParallel):
        model.finish_grad_sync()  # then torch's clip in the optimizer's order, as for DDP
    params = [p for group in optimizer.param_groups for p in group["params"]]
    return torch.nn.utils.clip_grad_norm_(params, max_norm, norm_type)
