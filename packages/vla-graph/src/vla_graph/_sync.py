"""The gradient-sync object GraphedStep drives, as a Protocol of its own (duck-typed: vla_graph imports no
data-parallel library). vla_overlap's `OverlapDataParallel.grad_sync` has this shape; so can any wrapper."""

from __future__ import annotations

from contextlib import AbstractContextManager
from typing import Protocol, runtime_checkable


@runtime_checkable
class GradSync(Protocol):
    """What GraphedStep calls: zero() before each iteration; no_sync() around every microbatch but the last;
    launch_in_backward() around the last one when the sync is captured with it; start() then finish() after
    the last backward; mark_synced() after replaying a graph that holds start()..finish()."""

    def zero(self) -> None: ...

    def no_sync(self) -> AbstractContextManager: ...

    def launch_in_backward(self) -> AbstractContextManager: ...

    def start(self) -> None: ...

    def finish(self) -> None: ...

    def mark_synced(self) -> None: ...


def check_grad_sync(sync: object) -> None:
    """Raise TypeError naming the missing methods when `sync` does not have the GradSync shape."""
    missing = [name for name in ("zero", "no_sync", "launch_in_backward", "start", "finish", "mark_synced")
               if not callable(getattr(sync, name, None))]  # fmt: skip
    if missing:
        raise TypeError(
            f"grad_sync ({type(sync).__name__}) lacks {', '.join(missing)}: pass an object with the GradSync "
            "methods (e.g. vla_overlap's OverlapDataParallel.grad_sync), or None to let vla_graph own .grad"
        )
