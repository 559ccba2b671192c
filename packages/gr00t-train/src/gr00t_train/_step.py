"""One step's forward and backward over its microbatches, through vla_graph's GraphedStep in the mode
`optimizations.graph` names (eager, full_iteration, per_microbatch), then the gradient sync."""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext

import torch
import vla_graph

from ._comm import CommSetup
from ._config import TrainConfig
from ._parts import Batch, TrainParts

StepRunner = Callable[[list[Batch]], torch.Tensor]
"""Runs forward + backward of every microbatch of a step and the gradient sync (gradients are then the
mean over microbatches and ranks); returns the mean loss, detached, on the device."""


def graphed_runner(
    cfg: TrainConfig,
    parts: TrainParts,
    comm: CommSetup,
    timed_sync: Callable[[Callable[[], None]], None] = lambda sync: sync(),
) -> tuple[StepRunner, vla_graph.GraphedStep]:
    """The StepRunner of `cfg.optimizations.graph`, and the GraphedStep behind it (for its report).

    `timed_sync(fn)` runs the explicit gradient sync; the loop passes one that times it as communication."""
    n = cfg.optim.grad_accum
    position = [0]

    def backward_context(last: bool) -> AbstractContextManager:
        # Only the last microbatch lets hooks communicate: eager overlap syncs at the end of its backward;
        # with the sync in the graph it launches from backward and GraphedStep captures the wait after it.
        if last and comm.sync_in_backward:
            return nullcontext()
        if last and comm.sync_in_graph and comm.launch_in_backward is not None:
            return comm.launch_in_backward()
        return comm.no_sync()

    def microbatch_step(batch: Batch) -> torch.Tensor:
        last = position[0] % n == n - 1  # graphs capture each microbatch position once, in order
        position[0] += 1
        with backward_context(last):
            loss = parts.loss_fn(comm.module, batch)  # precision (autocast) is the model's own business
            (loss / n).backward()
        return loss.detach()

    step = vla_graph.GraphedStep(
        microbatch_step,
        params=[(name, p) for name, p in parts.model.named_parameters() if p.requires_grad],
        config=vla_graph.GraphConfig(
            mode=cfg.optimizations.graph,
            warmup_iters=cfg.optimizations.graph_warmup,
            grads="owned" if comm.zero_grad is None else "external",
            sync_in_graph=comm.sync_in_graph,  # set by build_comm for per_microbatch only
        ),
        draw=parts.draw,
        zero_grad=comm.zero_grad,
        start_grad_sync=comm.start_sync if comm.sync_in_graph else None,
        finish_grad_sync=comm.finish_sync if comm.sync_in_graph else None,
        after_replayed_sync=comm.mark_synced if comm.sync_in_graph else None,
    )

    def sync() -> None:
        comm.start_sync()
        comm.finish_sync()

    def run(microbatches: list[Batch]) -> torch.Tensor:
        position[0] = 0
        losses = step(microbatches)
        if comm.start_sync is not None and not comm.sync_in_graph:
            timed_sync(sync)  # a no-op when the last backward already synced (eager overlap)
        return torch.stack([loss.float() for loss in losses]).mean()

    return run, step
