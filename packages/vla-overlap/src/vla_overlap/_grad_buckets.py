"""Gradient buffers and their bucket collectives.

Invariant that keeps every rank's collectives matched: buckets launch strictly in index order. A complete
bucket waits for all lower-numbered buckets to launch first; `launch_all()` launches the rest, in order.
"""

from __future__ import annotations

from typing import Any

import torch

from ._cast_kernel import cast_into
from ._comm import CommStream, Communicator
from ._layout import BucketedBuffers, Layout


def accumulate_into(target: torch.Tensor, grad: torch.Tensor, first: bool) -> None:
    """target = grad (the step's first gradient, with buffers not zeroed) or target += grad (a bf16 gradient
    into an fp32 buffer by a vectorized kernel on CUDA)."""
    cast_into(target, grad, add=not first)


class GradBuckets(BucketedBuffers):
    """Contiguous gradient buffers (one per dtype pair), each parameter's `main_grad` view into them, and
    the asynchronous all-reduce (or reduce-scatter, when sharded) of every bucket."""

    def __init__(
        self,
        layout: Layout,
        shapes: list[torch.Size],
        device: torch.device,
        comm: Communicator,
        stream: CommStream,
        reduce_dtype: torch.dtype | None = None,
    ) -> None:
        self.layout = layout
        self.comm = comm
        self.stream = stream
        self.sharded = False
        self.data = [torch.zeros(b.numel, dtype=b.grad_dtype, device=device) for b in layout.buffers]
        # With a narrower reduce_dtype each bucket travels through a buffer of its own (persistent: CUDA graphs
        # bake its address in): accumulation stays in the gradient dtype, only the wire is narrow.
        self.wire = [
            torch.zeros(b.numel, dtype=reduce_dtype, device=device)
            if reduce_dtype is not None and reduce_dtype != layout.buffers[b.buffer].grad_dtype
            else None
            for b in layout.buckets
        ]
        self.main_grads = [
            self.data[s.buffer][s.start : s.start + s.numel].view(shape)
            for s, shape in zip(layout.slots, shapes)
        ]
        self._handles: list[Any] = [None] * len(layout.buckets)
        self._missing = [len(b.slots) for b in layout.buckets]
        self._ready = [False] * len(layout.slots)
        self._next = 0  # first bucket not launched yet

    def is_launched(self, slot: int) -> bool:
        return self.layout.slots[slot].bucket < self._next

    @property
    def all_launched(self) -> bool:
        return self._next == len(self.layout.buckets)

    def mark_ready(self, slot: int, launch: bool) -> None:
        """The last microbatch's gradient of `slot` is in the buffer; launch what is complete, in order."""
        if self._ready[slot]:
            return
        self._ready[slot] = True
        self._missing[self.layout.slots[slot].bucket] -= 1
        if launch:
            while self._next < len(self._missing) and self._missing[self._next] == 0:
                self._launch_next()

    def launch_all(self) -> None:
        while not self.all_launched:
            self._launch_next()

    def _launch_next(self) -> None:
        bucket = self._next
        view = self.bucket_view(bucket)
        with self.stream.launch():
            # Mean over ranks as a pre-scale + SUM: portable (gloo has no PREMUL_SUM) and the same
            # arithmetic torch DDP uses.
            if self.comm.size > 1:
                view.mul_(1.0 / self.comm.size)
            wire = self.wire[bucket]
            if wire is not None:
                wire.copy_(view)  # rounded to the reduce dtype once, after the pre-scale
                view = wire
            if self.sharded:
                self._handles[bucket] = self.comm.reduce_scatter(self._own(bucket, view), view)
            else:
                self._handles[bucket] = self.comm.all_reduce(view)
        self._next += 1

    def _own(self, bucket: int, flat: torch.Tensor) -> torch.Tensor:
        """This rank's shard of a bucket-sized tensor."""
        spec = self.layout.buckets[bucket]
        lo, hi = spec.shard_range(self.comm.rank, self.comm.size)
        return flat[lo - spec.start : hi - spec.start]

    def _unwire(self, bucket: int) -> None:
        """Bring a bucket reduced in the narrower dtype back into the gradient buffer."""
        wire = self.wire[bucket]
        if wire is not None:
            if self.sharded:
                self.shard_view(bucket).copy_(self._own(bucket, wire))
            else:
                self.bucket_view(bucket).copy_(wire)

    def mark_all_done(self) -> None:
        """Every bucket was launched and waited for by work this object did not issue (a replayed graph)."""
        self._next = len(self.layout.buckets)
        self._handles = [None] * len(self.layout.buckets)

    def wait_all(self) -> None:
        """Block (CPU) or make the current stream wait (CUDA) until every launched collective is done."""
        for bucket, handle in enumerate(self._handles):
            if handle is not None:
                handle.wait()
                self._unwire(bucket)
                self._handles[bucket] = None
        self.stream.join()

    def reset(self, zero: bool = True) -> None:
        """Start a new step (after waiting for anything still in flight): zero the buffers, or with
        `zero=False` leave them to be overwritten by each parameter's first gradient."""
        self.wait_all()
        if zero:
            for data in self.data:
                data.zero_()
        self._missing = [len(b.slots) for b in self.layout.buckets]
        self._ready = [False] * len(self.layout.slots)
        self._next = 0
