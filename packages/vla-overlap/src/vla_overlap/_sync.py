"""GradSync: the one object a step runner drives to synchronize one step's gradients.

The protocol is owned here. A step runner (a training loop, or vla_graph's GraphedStep, which declares the
same shape as its own Protocol and never imports this package) calls, per step:

    zero()                                   before the step's first backward
    with no_sync(): backward                 every microbatch but the last: accumulate only
    backward                                 the last microbatch, plain: hooks reduce bucket by bucket and
                                             wait when backward ends (eager overlap)
      or with launch_in_backward(): backward the last microbatch when the wait must be issued by the caller
                                             (e.g. captured in the same CUDA graph), then start(); finish()
    start(); finish()                        idempotent: launch whatever is left, wait for all of it
    mark_synced()                            after replaying a graph that ran start()..finish(): Python
                                             never ran, so only the bookkeeping is done
"""

from __future__ import annotations

from contextlib import AbstractContextManager
from typing import TYPE_CHECKING, Protocol, runtime_checkable

if TYPE_CHECKING:
    from ._wrapper import OverlapDataParallel


@runtime_checkable
class GradSync(Protocol):
    """One step's gradient synchronization, in the calls a step runner makes (see the module docstring)."""

    def zero(self) -> None:
        """Start a step: zero the gradient buffers and forget what the last step did."""
        ...

    def no_sync(self) -> AbstractContextManager:
        """Backward passes inside only accumulate."""
        ...

    def launch_in_backward(self) -> AbstractContextManager:
        """A backward inside launches each bucket's collective as soon as it is complete, without waiting
        at its end: the caller calls start() and finish()."""
        ...

    def start(self) -> None:
        """Launch every collective not launched yet, in order (idempotent within a step)."""
        ...

    def finish(self) -> None:
        """Wait for every collective; gradients are final when it returns (idempotent within a step)."""
        ...

    def mark_synced(self) -> None:
        """The buffers already hold the reduced gradients (a replayed graph ran start()..finish())."""
        ...


class OverlapGradSync:
    """The GradSync of an OverlapDataParallel (its `grad_sync` attribute): the wrapper's own methods under
    the protocol's names."""

    def __init__(self, model: OverlapDataParallel) -> None:
        self._model = model

    def zero(self) -> None:
        self._model.zero_grad_buffer()

    def no_sync(self) -> AbstractContextManager:
        return self._model.no_sync()

    def launch_in_backward(self) -> AbstractContextManager:
        return self._model.launch_in_backward()

    def start(self) -> None:
        self._model.start_grad_sync()

    def finish(self) -> None:
        self._model.finish_grad_sync()

    def mark_synced(self) -> None:
        self._model.mark_grads_synced()
