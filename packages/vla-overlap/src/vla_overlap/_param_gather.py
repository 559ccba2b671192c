"""Parameter buffers for the sharded optimizer, and the all-gathers that refresh them after each step.

Gathers are dispatched strictly in forward order (highest bucket index first), whoever asks: a module that
runs out of order dispatches every earlier bucket before its own, so every rank issues the same collectives
in the same order and no module ever reads a bucket that was not waited for.
"""

from __future__ import annotations

from typing import Any

import torch

from ._comm import CommStream, Communicator
from ._layout import BucketedBuffers, Layout


class ParamGather(BucketedBuffers):
    """Moves each trainable parameter's storage into a contiguous per-dtype buffer (same offsets as the
    gradient buffers) and all-gathers that buffer bucket by bucket."""

    def __init__(
        self,
        layout: Layout,
        params: list[torch.nn.Parameter],
        device: torch.device,
        comm: Communicator,
        stream: CommStream,
    ) -> None:
        self.layout = layout
        self.comm = comm
        self.stream = stream
        self.data = [torch.empty(b.numel, dtype=b.param_dtype, device=device) for b in layout.buffers]
        for data in self.data:
            data.zero_()  # padding must hold finite values: it travels through every gather
        with torch.no_grad():
            for slot, param in zip(layout.slots, params):
                view = self.data[slot.buffer][slot.start : slot.start + slot.numel].view_as(param)
                view.copy_(param)
                param.data = view
        self._order = list(reversed(range(len(layout.buckets))))
        self._position = {bucket: i for i, bucket in enumerate(self._order)}
        self._handles: dict[int, Any] = {}
        self._next = len(self._order)  # index into _order of the next gather to dispatch; none pending

    @property
    def pending(self) -> bool:
        """True while some bucket still has to be gathered or waited for."""
        return self._next < len(self._order) or bool(self._handles)

    def start(self) -> None:
        """Every bucket's shard was just updated: all of them need a gather before they are read."""
        if self.pending:
            raise RuntimeError("internal: a new parameter gather started before the previous one finished")
        self._next = 0

    def _dispatch_next(self) -> None:
        bucket = self._order[self._next]
        with self.stream.launch():
            self._handles[bucket] = self.comm.all_gather(self.bucket_view(bucket), self.shard_view(bucket))
        self._next += 1

    def ensure(self, bucket: int) -> None:
        """Dispatch (in order) up to `bucket`, wait for it, and prefetch the following bucket."""
        while self._next <= self._position[bucket]:
            self._dispatch_next()
        handle = self._handles.pop(bucket, None)
        if handle is not None:
            handle.wait()
            self.stream.join()
        if self._next < len(self._order):
            self._dispatch_next()

    def finish(self) -> None:
        """Dispatch everything left and wait for all of it."""
        while self._next < len(self._order):
            self._dispatch_next()
        for bucket in sorted(self._handles, key=self._position.__getitem__):
            self._handles.pop(bucket).wait()
        self.stream.join()
