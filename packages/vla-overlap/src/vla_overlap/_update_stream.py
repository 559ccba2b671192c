"""UpdateStream: the optimizer step off the critical path.

A training step's first work often reads no trainable parameter (a frozen encoder's forward). So the optimizer
step of step N (and the zeroing of gradients for N+1) can run on a side stream while step N+1's frozen work
runs on the compute stream; the compute stream waits (`wait()`) only right before it first reads a trainable
parameter. The fence is a CUDA event created with `external=True`: inside a CUDA graph capture the wait
becomes an event-wait node, so a replayed graph waits for the latest update issued before its launch.

On CPU (or any non-CUDA device) there are no streams: everything runs in program order and `wait()` is a no-op.

Stages (`add_stages`, DistributedAdamW.stage_update): the update marks a fence after each stage of parameters
(`mark_stage`), in the order the forward first reads them, and each layer waits only for its own stage
(`wait_stage`), so the update's tail runs beside the first trainable layers instead of before them.

    updates = UpdateStream(device)
    sync = updates.grad_sync(model.grad_sync)   # zero() runs on the side stream, after the update
    ...                                         # step: frozen work; updates.wait(); trainable fwd + bwd
    with updates.side():                        # after the step's gradients are reduced
        clip_grad_norm(...); optimizer.step()
    updates.wait()                              # before reading parameters (checkpoints, evaluation) or
                                                # tensors the update produced (the grad norm)
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager

import torch

from ._sync import GradSync


class UpdateStream:
    """A side CUDA stream for optimizer steps, and the fence work reading updated parameters waits on."""

    def __init__(self, device: torch.device | str) -> None:
        device = torch.device(device)
        cuda = device.type == "cuda"
        self.device = device
        self._stream = torch.cuda.Stream(device) if cuda else None
        self._fence = torch.cuda.Event(external=True) if cuda else None
        self._recorded = False
        self._stages: list[torch.cuda.Event] = []

    def add_stages(self, count: int) -> None:
        """Fences for `count` stages of the update. Each is recorded once now (it passes at once), so a wait
        captured in a CUDA graph before the first update still becomes a node that waits on later records."""
        if self._stream is None:
            return
        self._stages = [torch.cuda.Event(external=True) for _ in range(count)]
        for fence in self._stages:
            fence.record(self._stream)

    def mark_stage(self, stage: int) -> None:
        """Inside `side()`: the update's work issued so far completes stage `stage`."""
        if self._stages:
            self._stages[stage].record(torch.cuda.current_stream(self.device))

    def wait_stage(self, stage: int) -> None:
        """Make the current stream wait for the update's stages up to `stage` (graph-safe, as `wait()`);
        without stages, for the whole update."""
        if not self._stages:
            self.wait()
        else:
            torch.cuda.current_stream(self.device).wait_event(self._stages[stage])

    @contextmanager
    def side(self) -> Iterator[None]:
        """Run the enclosed work on the side stream, after everything already queued on the current stream
        (the gradients it reads); the fence then marks its end."""
        if self._stream is None:
            yield
            return
        current = torch.cuda.current_stream(self.device)
        self._stream.wait_stream(current)
        with torch.cuda.stream(self._stream):
            yield
        self._fence.record(self._stream)
        self._recorded = True

    def wait(self) -> None:
        """Make the current stream wait for the side-stream work issued so far (graph-safe: captured as an
        event-wait node that waits for the latest record when the graph runs)."""
        if self._fence is not None and self._recorded:
            torch.cuda.current_stream(self.device).wait_event(self._fence)

    def grad_sync(self, inner: GradSync) -> GradSync:
        """`inner` with its zero() issued on the side stream, so clearing the gradients for the next step
        follows the update that read them instead of holding up the compute stream."""
        return _ZeroOnSide(inner, self)


class _ZeroOnSide:
    def __init__(self, inner: GradSync, updates: UpdateStream) -> None:
        self._inner, self._updates = inner, updates

    def zero(self) -> None:
        with self._updates.side():
            self._inner.zero()

    def no_sync(self) -> AbstractContextManager:
        return self._inner.no_sync()

    def launch_in_backward(self) -> AbstractContextManager:
        return self._inner.launch_in_backward()

    def start(self) -> None:
        self._inner.start()

    def finish(self) -> None:
        self._inner.finish()

    def mark_synced(self) -> None:
        self._inner.mark_synced()
