"""Gradient communication: which object synchronizes gradients, and where, for every `optimizations.comm` x
`optimizations.graph`, decided in one function (`plan_grad_sync`)."""

from __future__ import annotations

import logging
import math
from collections.abc import Callable
from contextlib import nullcontext
from dataclasses import dataclass
from typing import Any

import torch
import vla_graph
import vla_overlap
from torch import nn

from ._distributed import DistEnv
from ._errors import ConfigError
from ._optim import param_groups
from .config.sections import TrainConfig

log = logging.getLogger(__name__)


@dataclass
class SyncPlan:
    """The model as the loop calls it, its optimizer, and the gradient sync GraphedStep drives."""

    module: nn.Module
    """What forward is called on (the wrapper)."""
    optimizer: Any
    """Has param_groups, step(), state_dict(), load_state_dict()."""
    grad_sync: Any
    """The GradSync object (zero / no_sync / launch_in_backward / start / finish / mark_synced)."""
    sync_in_graph: bool
    """Graph modes: the sync is captured in the graphs (else it runs eagerly after the replays)."""
    clip_grad_norm: Callable[[float], torch.Tensor]
    """Global gradient norm before clipping; clips to the given value (0 = no clipping)."""


def plan_grad_sync(model: nn.Module, cfg: TrainConfig, env: DistEnv) -> SyncPlan:
    """Wrap `model`, build its AdamW and decide where gradients are reduced.

    When the mean gradient over ranks is ready, by `optimizations.comm` (rows) and `.graph` (columns):

    | comm                     | eager                             | per_microbatch / full_iteration    |
    |--------------------------|-----------------------------------|------------------------------------|
    | allreduce_after_backward | all buckets all-reduced when the  | all-reduced after the replays      |
    |                          | last backward ends (the baseline) |                                    |
    | ddp                      | torch DDP's hooks, during the     | not allowed (hooks do not run at   |
    |                          | last backward                     | replay; config error)              |
    | overlap                  | each bucket all-reduced from the  | sync_in_graph: launched bucket by  |
    |                          | last backward's hooks as soon as  | bucket from the last microbatch's  |
    |                          | it is complete, waited at its end | backward, inside the graph that    |
    |                          |                                   | holds it, and waited at its end;   |
    |                          |                                   | else after the replays             |
    | zero1_overlap            | as overlap, reduce-scatter; the   | as overlap, reduce-scatter;        |
    |                          | parameter all-gather is waited    | parameters gathered at the end of  |
    |                          | for by forward pre-hooks          | the optimizer step                 |

    Every microbatch but the last only accumulates (no_sync)."""
    opts, optim = cfg.optimizations, cfg.optim
    graphs = opts.graph != "eager"
    overlap = vla_overlap.OverlapConfig(
        bucket_elements=bucket_elements(opts.bucket_mib, torch.float32),
        grad_reduce_dtype=_grad_buffer_dtype(cfg, env),
        # Forward pre-hooks (Python) do not fire during graph replay: gather parameters in step() instead.
        overlap_param_gather=not graphs,
        # The baseline reduces every bucket after backward, by definition.
        overlap_grad_reduce=opts.comm != "allreduce_after_backward",
        reduce_dtype=torch.bfloat16 if opts.grad_reduce_dtype == "bfloat16" else None,
    )
    groups = param_groups(model.named_parameters(), optim.weight_decay)
    adamw = dict(lr=optim.lr, betas=optim.betas, eps=optim.eps, weight_decay=optim.weight_decay,
                 fused=opts.fused_optimizer)  # fmt: skip
    # Autograd nodes the wrapper keeps must live on the capture stream, or capture fails (vla_graph README).
    where = vla_graph.capture_stream() if graphs and env.device.type == "cuda" else nullcontext()
    with where:
        if opts.comm == "ddp":  # the ablation's baseline: torch's own wrapper and AdamW
            from ._baselines import DDPGradSync, ddp_with_adamw

            ddp, optimizer = ddp_with_adamw(model, groups, adamw)
            return SyncPlan(ddp, optimizer, DDPGradSync(ddp), False, _clipper(optimizer))
        wrapped = vla_overlap.OverlapDataParallel(model, overlap)
        if opts.weight_grads_in_place and overlap.grad_reduce_dtype is None:
            # buffers in the weights' dtype: the GEMMs can write them
            routed = wrapped.write_weight_grads_in_place()
            log.info("weight gradients: %d linear layers write their gradient buffers directly", routed)
        if opts.comm == "zero1_overlap":
            moments = adam_moments(cfg)
            flat = _flat_kernel(opts, env) or ("torch" if moments == "int8" else None)  # int8: a flat step
            remainders = opts.param_remainders and opts.bf16_weights == "on" and flat is not None
            optimizer = vla_overlap.DistributedAdamW(
                wrapped, groups, **adamw, flat=flat, remainders=remainders, **moments_argument(moments)
            )
        else:
            optimizer = torch.optim.AdamW(groups, **adamw)
    overlapped = opts.comm != "allreduce_after_backward"
    in_graph = overlapped and graphs and opts.sync_in_graph
    return SyncPlan(wrapped, optimizer, wrapped.grad_sync, in_graph, _clipper(optimizer, wrapped))


def _grad_buffer_dtype(cfg: TrainConfig, env: DistEnv) -> torch.dtype | None:
    """fp32 gradient buffers: our comm modes accumulate and reduce in fp32. Except where nothing accumulates
    (one microbatch, one rank) and the flat step reads bf16 weights' gradients in place: there the buffers
    keep each weight's dtype (None). Every value is autograd's bf16 gradient either way, widening is exact,
    and the step and the norm widen as they load, so the update is the same while the gradient copy, the norm
    and the step move 6 fewer bytes per parameter and the buffers hold 3.2 GB less for n1.6-3b (on an H200:
    215.2 -> 220.7 samples/s, peak memory 29.8 -> 27.4 GiB)."""
    opts = cfg.optimizations
    in_place = opts.bf16_weights == "on" and _flat_kernel(opts, env) is not None
    return None if in_place and cfg.optim.grad_accum == 1 and env.world_size == 1 else torch.float32


def adam_moments(cfg: TrainConfig) -> str:
    """AdamW's moments as the optimizer holds them: memory.adam_moments (auto: fp32; the memory planner
    resolves it where a budget needs int8)."""
    return "int8" if cfg.memory.adam_moments == "int8" else "fp32"


def moments_argument(moments: str) -> dict:
    """DistributedAdamW's `moments` argument, left out for fp32 (vla-overlap versions without 8-bit moments)."""
    return {} if moments == "fp32" else {"moments": moments}


def _flat_kernel(opts: Any, env: DistEnv) -> str | None:
    """DistributedAdamW's `flat` argument for `optimizations.flat_optimizer` (auto: the Triton step on CUDA)."""
    on_gpu = env.device.type == "cuda"
    if opts.flat_optimizer == "on" and not on_gpu:
        raise ConfigError("optimizations.flat_optimizer", f"needs a CUDA device, the run is on {env.device}")
    return "triton" if on_gpu and opts.flat_optimizer != "off" else None


def bucket_elements(mib: float, grad_dtype: torch.dtype) -> int:
    """`mib` MiB of gradient buffer in `grad_dtype` as vla-overlap's bucket size, which counts elements."""
    itemsize = torch.empty((), dtype=grad_dtype).element_size()
    return max(1, int(mib * 2**20 / itemsize))


def _clipper(
    optimizer: torch.optim.Optimizer, wrapped: vla_overlap.OverlapDataParallel | None = None
) -> Callable[[float], torch.Tensor]:
    """The clip of one mode: global norm before clipping, clipped to `max_norm` (0: measured, not clipped)."""

    def clip(max_norm: float) -> torch.Tensor:
        max_norm = max_norm if max_norm > 0 else math.inf
        if isinstance(optimizer, vla_overlap.DistributedAdamW):
            return optimizer.clip_grad_norm_(max_norm)  # over every rank's shard
        if wrapped is not None:
            wrapped.finish_grad_sync()
        # torch's clip over the optimizer's parameters in its order, as torch DDP + AdamW: the same norm.
        return torch.nn.utils.clip_grad_norm_(
            [p for g in optimizer.param_groups for p in g["params"]], max_norm
        )

    return clip
