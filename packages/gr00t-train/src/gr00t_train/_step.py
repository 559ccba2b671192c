"""One step's forward and backward over its microbatches, through vla_graph's GraphedStep in the mode
`optimizations.graph` names (eager, full_iteration, per_microbatch)."""

from __future__ import annotations

from collections.abc import Callable
from contextlib import nullcontext

import torch
import vla_graph

from ._comm import CommSetup
from ._config import TrainConfig
from ._parts import Batch, TrainParts

StepRunner = Callable[[list[Batch]], torch.Tensor]
"""Runs forward + backward of every microbatch of a step (gradients summed and scaled by 1/n, gradient
sync done); returns the mean loss, detached, on the device."""


def graphed_runner(
    cfg: TrainConfig,
    parts: TrainParts,
    comm: CommSetup,
    timed_finish: Callable[[], None] | None = None,
) -> tuple[StepRunner, vla_graph.GraphedStep]:
    """The StepRunner of `cfg.optimizations.graph`, and the GraphedStep behind it (for its report)."""
    n = cfg.optim.grad_accum
    position = [0]

    def microbatch_step(batch: Batch) -> torch.Tensor:
        # Only wrappers whose hooks communicate during backward (torch DDP) need no_sync; that path is
        # eager-only (config validation), so counting microbatches in Python is safe here.
        last = position[0] % n == n - 1
        position[0] += 1
        with nullcontext() if last else comm.no_sync():
            loss = parts.loss_fn(comm.module, batch)  # precision (autocast) is the model's own business
            (loss / n).backward()
        return loss.detach()

    mode = cfg.optimizations.graph
    finish = comm.finish
    if timed_finish is not None and mode != "full_iteration":
        finish = timed_finish  # runs eagerly after the last backward: time it as exposed communication
    step = vla_graph.GraphedStep(
        microbatch_step,
        params=[(name, p) for name, p in parts.model.named_parameters() if p.requires_grad],
        config=vla_graph.GraphConfig(
            mode=mode,
            warmup_iters=cfg.optimizations.graph_warmup,
            grads="external" if comm.external_grads else "owned",
        ),
        draw=parts.draw,
        start_grad_sync=comm.start_sync,
        finish_grad_sync=finish,
        zero_grad=comm.zero_grad,
    )

    def run(microbatches: list[Batch]) -> torch.Tensor:
        position[0] = 0
        losses = step(microbatches)
        return torch.stack([loss.float() for loss in losses]).mean()

    return run, step
