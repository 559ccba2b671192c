"""Parameters and their gradients: never let a graph's private memory become a `.grad`.

A captured backward writes gradients where it wrote them at capture. If `.grad` was None then, autograd
adopts a graph-owned buffer as `.grad` and the next replay overwrites it: accumulation across
microbatches silently breaks. So without a gradient-sync object every trainable parameter gets a `.grad`
allocated here, outside the graph pool, before anything runs; backward then accumulates into it in place, and
that in-place add is what the graph records. With a sync object, its buffers hold the gradients and the
check after capture makes sure no `.grad` was left pointing at new (graph) memory."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import torch


def _named(params: Iterable[Any]) -> list[tuple[str, torch.Tensor]]:
    named = []
    for index, item in enumerate(params):
        if isinstance(item, tuple) and len(item) == 2 and isinstance(item[1], torch.Tensor):
            named.append((str(item[0]), item[1]))
        elif isinstance(item, torch.Tensor):
            named.append((f"parameter #{index} {tuple(item.shape)}", item))
        else:
            raise TypeError(
                f"params item #{index} is a {type(item).__name__}; pass model.parameters() or "
                "model.named_parameters()"
            )
    return named


class ParamSet:
    """The parameters a step trains, their gradient buffers (owned here, or by a sync object) and the
    addresses a graph baked in."""

    def __init__(self, params: Iterable[Any], grad_sync: Any = None) -> None:
        self.named = _named(params)
        if not self.named:
            raise ValueError("params is empty; pass the parameters the step trains (model.parameters())")
        self.trainable = [(name, p) for name, p in self.named if p.requires_grad]
        self.device = self.named[0][1].device
        for name, p in self.named:
            if p.device != self.device:
                raise ValueError(f"{name} is on {p.device} but the first parameter is on {self.device}")
        self.owns_grads = grad_sync is None
        self._sync = grad_sync
        self.owned: list[torch.Tensor] = []
        self._addresses: list[int] | None = None
        self._warm_grads: list[torch.Tensor | None] = []

    def prepare(self) -> None:
        """Attach the owned `.grad` buffers (creating them on first use; re-attaching after set_to_none)."""
        if not self.owns_grads:
            return
        if not self.owned:
            for _, p in self.trainable:
                if p.grad is None:
                    p.grad = torch.zeros_like(p)
                self.owned.append(p.grad)
            return
        grads = [p.grad for _, p in self.trainable]
        if all(g is o for g, o in zip(grads, self.owned)):
            return  # the common case, checked in one pass
        for (name, p), grad, owned in zip(self.trainable, grads, self.owned):
            if grad is None:
                p.grad = owned
            elif grad.data_ptr() != owned.data_ptr():
                raise RuntimeError(
                    f"{name}.grad was replaced by a new tensor; graphs write gradients into the buffer they "
                    "were captured with. Zero gradients in place or with set_to_none=True (vla_graph "
                    "re-attaches its buffer), or call GraphedStep.reset() after replacing them"
                )

    def zero(self) -> None:
        """Clear the gradients before an iteration (and after warmup)."""
        if self.owns_grads:
            self.prepare()  # every iteration starts with the buffers attached (hooks may have dropped them)
            torch._foreach_zero_(self.owned)
        else:
            self._sync.zero()

    def remember_addresses(self) -> None:
        """Record where every parameter lives; graphs bake these addresses in."""
        self._addresses = [p.data_ptr() for _, p in self.named]

    def forget_addresses(self) -> None:
        self._addresses = None

    def check_addresses(self) -> None:
        """Raise if a parameter moved since capture (reassigned `.data`, `.to()`, a new tensor)."""
        if self._addresses is None or [p.data_ptr() for _, p in self.named] == self._addresses:
            return
        for (name, p), address in zip(self.named, self._addresses):
            if p.data_ptr() != address:
                raise RuntimeError(
                    f"{name} moved to new memory since the graph was captured (was .data reassigned or the "
                    "model moved?). Graphs bake parameter addresses in: update parameters in place "
                    "(optimizers and load_state_dict do), or call GraphedStep.reset() to capture again"
                )

    def remember_warm_grads(self) -> None:
        """Each `.grad` after the last warmup iteration, which ran what the graphs will hold (kept referenced
        until the check, so no new tensor can take its address)."""
        self._warm_grads = [p.grad for _, p in self.trainable]

    def check_after_capture(self) -> None:
        """Make sure no `.grad` is graph-owned memory after a capture."""
        if self.owns_grads:
            for (name, p), grad in zip(self.trainable, self.owned):
                if p.grad is None or p.grad.data_ptr() != grad.data_ptr():
                    raise RuntimeError(
                        f"{name}.grad is no longer the buffer vla_graph attached after capturing the step "
                        "(a gradient hook replaced or removed it), so graph-owned memory would be exposed. "
                        "If your code moves gradients into its own buffers, pass its GradSync object as "
                        "GraphedStep(grad_sync=...)"
                    )
            return
        # The same iteration ran eagerly just before capture: a .grad the sync object exposes (its own
        # buffer) is where it was then; a .grad autograd allocated inside the capture is new graph memory.
        warm_grads, self._warm_grads = self._warm_grads, []
        for (name, p), warm in zip(self.trainable, warm_grads):
            if p.grad is not None and (warm is None or p.grad.data_ptr() != warm.data_ptr()):
                raise RuntimeError(
                    f"{name}.grad was set to new memory during capture: that tensor lives in the graph's "
                    "memory pool and the next replay overwrites it. The grad_sync object's hooks must move "
                    "each gradient into its own buffer (and set .grad to None or to that buffer); or pass "
                    "grad_sync=None to let vla_graph own .grad"
                )
