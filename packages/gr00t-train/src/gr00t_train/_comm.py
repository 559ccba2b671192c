"""Gradient communication, one mode per `optimizations.comm` value, behind one small interface."""

from __future__ import annotations

import math
from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from ._config import TrainConfig
from ._distributed import DistEnv
from ._optim import build_adamw


@dataclass
class CommSetup:
    """The model as the loop calls it, its optimizer, and the gradient-sync hooks of the chosen mode."""

    module: nn.Module
    """What forward is called on (the wrapper, if any)."""
    optimizer: Any
    """Has param_groups, step(), zero_grad(), state_dict(), load_state_dict()."""
    no_sync: Callable[[], AbstractContextManager]
    """Context for microbatches whose gradients must not be communicated yet."""
    finish: Callable[[], None]
    """Called after the last backward: gradients are reduced when it returns."""
    clip_grad_norm: Callable[[float], torch.Tensor]
    """Global gradient norm before clipping; clips to the given value (inf = no clipping)."""
    zero_grad: Callable[[], None] | None = None
    """Reset the wrapper's own gradient buffers (needed with external_grads)."""
    optimizer_sharded: bool = False
    """Each rank holds a different part of the optimizer state (saved per rank)."""
    start_sync: Callable[[], None] | None = None
    """Explicit launch of the gradient collectives, for callers where hooks do not fire (graph replay)."""
    external_grads: bool = False
    """The wrapper moves gradients into its own buffers and leaves `.grad` None."""


def _clip(params: list[nn.Parameter]) -> Callable[[float], torch.Tensor]:
    def clip(max_norm: float) -> torch.Tensor:
        return torch.nn.utils.clip_grad_norm_(params, max_norm if max_norm > 0 else math.inf)

    return clip


def build_torch_ddp(model: nn.Module, cfg: TrainConfig, env: DistEnv) -> CommSetup:
    """torch's DistributedDataParallel: bucketed all-reduce overlapped inside backward."""
    ddp = nn.parallel.DistributedDataParallel(
        model,
        device_ids=[env.device.index] if env.device.type == "cuda" else None,
        bucket_cap_mb=cfg.optimizations.bucket_mb,
        # False: .grad stays the tensor vla_graph attached (bucket views would replace it).
        gradient_as_bucket_view=False,
    )
    optimizer = build_adamw(model, cfg.optim, cfg.optimizations.fused_optimizer)
    trainable = [p for p in model.parameters() if p.requires_grad]
    return CommSetup(ddp, optimizer, ddp.no_sync, lambda: None, _clip(trainable))


def build_comm(model: nn.Module, cfg: TrainConfig, env: DistEnv) -> CommSetup:
    """The CommSetup for `cfg.optimizations.comm`."""
    mode = cfg.optimizations.comm
    if mode == "ddp":
        return build_torch_ddp(model, cfg, env)
    raise NotImplementedError(f"optimizations.comm={mode} is wired when vla_overlap lands")
