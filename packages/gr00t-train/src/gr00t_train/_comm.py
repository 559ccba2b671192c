"""Gradient communication, one mode per `optimizations.comm` value, from vla_overlap, behind one small
interface the step runner and the loop use."""

from __future__ import annotations

import math
from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass
from typing import Any

import torch
import vla_graph
import vla_overlap
from torch import nn

from ._config import TrainConfig
from ._distributed import DistEnv
from ._optim import param_groups


@dataclass
class CommSetup:
    """The model as the loop calls it, its optimizer, and the gradient-sync hooks of the chosen mode."""

    module: nn.Module
    """What forward is called on (the wrapper)."""
    optimizer: Any
    """Has param_groups, step(), state_dict(), load_state_dict()."""
    no_sync: Callable[[], AbstractContextManager]
    """Context for backward passes that must only accumulate."""
    clip_grad_norm: Callable[[float], torch.Tensor]
    """Global gradient norm before clipping; clips to the given value (0 = no clipping)."""
    sync_in_backward: bool
    """The last microbatch's backward launches the collectives from its hooks (overlap with backward)."""
    start_sync: Callable[[], None] | None = None
    """Explicit launch of every bucket's collective (the path for graphs and the all-reduce baseline)."""
    finish_sync: Callable[[], None] | None = None
    """Wait for the collectives; gradients are reduced when it returns."""
    zero_grad: Callable[[], None] | None = None
    """Reset the wrapper's own gradient buffers; None: vla_graph owns plain `.grad` buffers."""
    sync_in_graph: bool = False
    """Graph modes: the last microbatch launches the collectives from its backward hooks and the sync is
    captured with it (`launch_in_backward`, then `mark_synced` after each replay)."""
    launch_in_backward: Callable[[], AbstractContextManager] | None = None
    """Context for the last microbatch's backward when the sync is captured in its graph."""
    mark_synced: Callable[[], None] | None = None
    """After a replay that ran the captured collectives: the gradients are reduced."""


def build_comm(model: nn.Module, cfg: TrainConfig, env: DistEnv) -> CommSetup:
    """Wrap `model` and build its AdamW for `cfg.optimizations.comm`."""
    opts, optim = cfg.optimizations, cfg.optim
    mode = opts.comm
    graphs = opts.graph != "eager"
    overlap = vla_overlap.OverlapConfig(
        bucket_size=max(1, int(opts.bucket_mb * 2**20 / 4)),  # MiB of fp32 gradients -> elements
        # Forward pre-hooks (Python) do not fire during graph replay: gather parameters in step() instead.
        overlap_param_gather=not graphs,
    )
    # Autograd nodes the wrapper keeps must live on the capture stream, or capture fails (vla_graph README).
    where = vla_graph.capture_stream() if graphs and env.device.type == "cuda" else nullcontext()
    with where:
        wrapped, optimizer = vla_overlap.build_data_parallel(
            model,
            mode,
            params=param_groups(model.named_parameters(), optim.weight_decay),
            lr=optim.lr,
            betas=optim.betas,
            eps=optim.eps,
            weight_decay=optim.weight_decay,
            fused=opts.fused_optimizer,
            config=overlap,
        )

    def clip(max_norm: float) -> torch.Tensor:
        return vla_overlap.clip_grad_norm_(wrapped, optimizer, max_norm if max_norm > 0 else math.inf)

    if mode == "ddp":  # torch DDP: all-reduce from its own hooks during backward; eager only (config check)
        return CommSetup(wrapped, optimizer, wrapped.no_sync, clip, sync_in_backward=True)
    overlapped = mode != "allreduce_after_backward"  # the baseline reduces after backward by definition
    return CommSetup(
        wrapped,
        optimizer,
        wrapped.no_sync,
        clip,
        # Hooks never fire during graph replay: graph modes either capture the collectives with the last
        # microbatch (comm_in_graph) or accumulate only and sync explicitly after the replay.
        sync_in_backward=overlapped and not graphs,
        start_sync=wrapped.start_grad_sync,
        finish_sync=wrapped.finish_grad_sync,
        zero_grad=wrapped.zero_grad_buffer,
        # per_microbatch only: ZeRO-1 reduce-scatters captured anywhere but in the last microbatch's backward
        # hooks differ from eager at 2 GPUs (about 6e-3 after 4 steps, BENCHMARKS.md); full_iteration keeps
        # the sync after the replay.
        sync_in_graph=overlapped and opts.graph == "per_microbatch" and opts.comm_in_graph,
        launch_in_backward=wrapped.launch_in_backward,
        mark_synced=wrapped.mark_grads_synced,
    )
