"""The small interfaces the training loop runs against. The builder (`model.build`) fills them from the
sibling packages; tests fill them with tiny stand-ins."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import torch
from torch import nn

if TYPE_CHECKING:
    from .checkpoint.weights import BaseWeights
    from .validation.held_out import HeldOut

Batch = dict[str, Any]
"""A training batch: tensors on the training device, plus `episode_index` for error messages."""


class BatchSource(Protocol):
    """An endless, resumable stream of batches on the training device."""

    def __next__(self) -> Batch:
        """The next batch."""
        ...

    def state_dict(self) -> dict[str, Any]:
        """Position after the last batch returned (not the read-ahead), for exact resumption."""
        ...

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue from a position returned by `state_dict`."""
        ...

    def timings(self) -> dict[str, float]:
        """Seconds spent since the last call in work measured by the source itself (`h2d`)."""
        ...

    def close(self) -> None:
        """Stop background work and release resources."""
        ...


@dataclass
class TrainParts:
    """Everything model- and data-specific that the loop needs."""

    model: nn.Module
    """The model, on the training device (frozen parameters have requires_grad=False)."""
    loss_fn: Callable[..., torch.Tensor]
    """Scalar training loss of one microbatch: loss_fn(module, batch), given the (possibly wrapped) module
    to call; with `frozen_prefix` set, loss_fn(module, batch, prefix) continues from that prefix."""
    data: BatchSource
    """Where batches come from."""
    save_model: Callable[[nn.Module, Path], None]
    """Write the model's weights (and config) into a folder."""
    load_model: Callable[[nn.Module, Path], None]
    """Load what `save_model` wrote into an existing model, in place."""
    flops_per_sample: float | None = None
    """Analytic training FLOPs of one sample (forward + backward), for MFU."""
    tokens_per_sample: float | None = None
    """Tokens one sample puts through the model, for tokens/s."""
    draw: Callable[[Batch], dict[str, torch.Tensor]] | None = None
    """Random inputs of one microbatch (flow-matching time and noise), drawn eagerly outside any graph
    and merged into the batch, so graphed and eager runs consume the same random stream."""
    close: Callable[[], None] | None = None
    """Called once when training ends (after `data.close()`)."""
    frozen_prefix: Callable[[Batch], Any] | None = None
    """The part of a microbatch's forward that reads no trainable parameter (None when nothing qualifies):
    with the optimizer overlapped, it runs before the step waits for the update."""
    update_stages: Callable[[], list[nn.Module]] | None = None
    """Modules in the order the forward first calls them, each reading its trainable parameters only inside its
    own forward (e.g. the trainable repeated blocks): with the optimizer overlapped, the update steps their
    parameters in that order and each waits only for its own (optimizations.staged_update)."""
    compile_model: Callable[[], int] | None = None
    """torch.compile the model's repeated blocks in place; returns how many (None: not supported)."""
    row_tables: tuple[list[nn.Parameter], str] | None = None
    """Parameters whose rows (dim 0) each sample picks by the batch's values under this key (per-category
    tables): rows no batch touched get zero gradients, and the flat optimizer skips them
    (optimizations.skip_untouched_rows)."""
    validation: HeldOut | list[HeldOut] | None = None
    """The held-out samples and how the model predicts them, scored every `eval.every` steps and after the
    last (`validation/component.py`); a list: a mixture's members, each scored on its own; None = none."""
    base: BaseWeights | None = None
    """Where the model's frozen weights were loaded from (model.checkpoint) and which state-dict keys that
    folder provided: checkpoints record it by path and hash instead of writing those tensors (`checkpoint/weights.py`).
    None: checkpoints write the frozen tensors."""
    facts: dict[str, Any] = field(default_factory=dict)
    """What the run's report (summary.json) states about where the run started: initial weights, tokenizer,
    and the warnings given at start-up (`warnings`: a list of lines)."""


def episode_ids(batch: Batch) -> list[int] | None:
    """The episode index of every sample of a batch, when the batch carries it."""
    ids = batch.get("episode_index")
    if ids is None:
        return None
    if isinstance(ids, torch.Tensor):
        return [int(i) for i in ids.reshape(-1).tolist()]
    return [int(i) for i in ids]
