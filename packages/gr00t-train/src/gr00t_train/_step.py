"""One step's forward and backward over its microbatches, through vla_graph's GraphedStep in the mode
`optimizations.graph` names (eager, full_iteration, per_microbatch), with the gradient sync of the plan."""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager

import torch
import vla_graph
import vla_overlap

from ._comm import SyncPlan
from ._config import TrainConfig
from ._parts import Batch, TrainParts

StepRunner = Callable[[list[Batch]], torch.Tensor]
"""Runs forward + backward of every microbatch of a step and the gradient sync (gradients are then the
mean over microbatches and ranks); returns the mean loss, detached, on the device."""


class TimedGradSync:
    """A GradSync that times the explicit sync (start + finish) as communication, except while a CUDA graph
    is being captured (no timing events there): with the sync in a graph, its exposed part is in `compute`."""

    def __init__(self, inner, phase: Callable[[str], AbstractContextManager]) -> None:
        self._inner, self._phase = inner, phase

    def zero(self) -> None:
        self._inner.zero()

    def no_sync(self) -> AbstractContextManager:
        return self._inner.no_sync()

    def launch_in_backward(self) -> AbstractContextManager:
        return self._inner.launch_in_backward()

    def start(self) -> None:
        if _capturing():
            self._inner.start()
            return
        self._started = self._phase("comm")
        self._started.__enter__()
        self._inner.start()

    def finish(self) -> None:
        try:
            self._inner.finish()
        finally:
            started, self._started = getattr(self, "_started", None), None
            if started is not None:
                started.__exit__(None, None, None)

    def mark_synced(self) -> None:
        self._inner.mark_synced()


def _capturing() -> bool:
    return torch.cuda.is_available() and torch.cuda.is_current_stream_capturing()


def graphed_runner(
    cfg: TrainConfig,
    parts: TrainParts,
    plan: SyncPlan,
    phase: Callable[[str], AbstractContextManager] | None = None,
    updates: vla_overlap.UpdateStream | None = None,
) -> tuple[StepRunner, vla_graph.GraphedStep]:
    """The StepRunner of `cfg.optimizations.graph`, and the GraphedStep behind it (for its report).

    `phase(name)` is the loop's timer: the explicit gradient sync is timed as `comm` with it. With `updates`
    (the optimizer runs on its side stream), each microbatch first computes the model's frozen prefix, then
    waits for the update before the trainable part; gradients are zeroed on the side stream after it."""
    n = cfg.optim.grad_accum
    split = updates is not None and parts.frozen_prefix is not None

    def microbatch_step(batch: Batch) -> torch.Tensor:
        # GraphedStep runs this under the sync's no_sync() / launch_in_backward() as the microbatch needs.
        if split:
            prefix = parts.frozen_prefix(batch)  # reads no trainable weight: overlaps the update
            updates.wait()
            loss = parts.loss_fn(plan.module, batch, prefix)
        else:
            if updates is not None:
                updates.wait()
            loss = parts.loss_fn(plan.module, batch)  # precision (autocast) is the model's own business
        (loss / n).backward()
        return loss.detach()

    sync = plan.grad_sync if updates is None else updates.grad_sync(plan.grad_sync)
    sync = sync if phase is None else TimedGradSync(sync, phase)
    step = vla_graph.GraphedStep(
        microbatch_step,
        params=[(name, p) for name, p in parts.model.named_parameters() if p.requires_grad],
        config=vla_graph.GraphConfig(
            mode=cfg.optimizations.graph,
            warmup_iters=cfg.optimizations.graph_warmup,
            sync_in_graph=plan.sync_in_graph,
        ),
        draw=parts.draw,
        grad_sync=sync,
    )

    def run(microbatches: list[Batch]) -> torch.Tensor:
        losses = step(microbatches)
        return torch.stack([loss.float() for loss in losses]).mean()

    return run, step
