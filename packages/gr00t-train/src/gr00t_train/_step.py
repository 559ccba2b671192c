"""One step's forward and backward over its microbatches, in the mode `optimizations.graph` names."""

from __future__ import annotations

from collections.abc import Callable
from contextlib import nullcontext

import torch

from ._comm import CommSetup
from ._parts import Batch, TrainParts

StepRunner = Callable[[list[Batch]], torch.Tensor]
"""Runs forward + backward of every microbatch of a step (gradients summed and scaled by 1/n, the
collectives of the last microbatch launched); returns the mean loss, detached, on the device."""


def autocast_for(device: torch.device, dtype: torch.dtype | None):
    """Autocast context factory for the compute precision (None = full precision)."""
    if dtype is None:
        return nullcontext
    return lambda: torch.autocast(device.type, dtype=dtype)


def eager_runner(parts: TrainParts, comm: CommSetup, autocast) -> StepRunner:
    """Plain PyTorch: each microbatch's forward and backward, gradient sync held back until the last."""

    def run(microbatches: list[Batch]) -> torch.Tensor:
        n = len(microbatches)
        total = None
        for i, batch in enumerate(microbatches):
            with comm.no_sync() if i < n - 1 else nullcontext():
                with autocast():
                    loss = parts.loss_fn(comm.module, batch)
                (loss / n).backward()
            total = loss.detach().float() if total is None else total + loss.detach().float()
        return total / n

    return run
