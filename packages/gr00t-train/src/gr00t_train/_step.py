"""One step's forward and backward over its microbatches, through vla_graph's GraphedStep in the mode
`optimizations.graph` names (eager, full_iteration, per_microbatch), then the gradient sync."""

from __future__ import annotations

from collections.abc import Callable
from contextlib import nullcontext

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

    def microbatch_step(batch: Batch) -> torch.Tensor:
        # Only the last microbatch of an eager overlap step lets hooks communicate. That decision is Python
        # state, so graph modes never take it (they accumulate only and sync after the replay).
        last = comm.sync_in_backward and position[0] % n == n - 1
        position[0] += 1
        with nullcontext() if last else comm.no_sync():
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
        ),
        draw=parts.draw,
        zero_grad=comm.zero_grad,
    )

    def sync() -> None:
        comm.start_sync()
        comm.finish_sync()

    def run(microbatches: list[Batch]) -> torch.Tensor:
        position[0] = 0
        losses = step(microbatches)
        if comm.start_sync is not None:
            timed_sync(sync)  # a no-op when the last backward already synced (eager overlap)
        return torch.stack([loss.float() for loss in losses]).mean()

    return run, step
