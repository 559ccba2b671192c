"""Where every trainable parameter lives: per-dtype contiguous buffers cut into buckets, and each rank's shard.

Pure bookkeeping (no tensors are allocated here), computed once and shared by the gradient side, the
parameter side and the sharded optimizer, so all three agree on every offset.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

PARAM_ALIGN = 64
"""Each parameter starts at a multiple of this many elements: aligned views for vectorized kernels."""
SHARD_ALIGN = 128
"""Each rank's shard of a bucket is a multiple of this many elements (buckets pad to world_size * it)."""


@dataclass(frozen=True)
class ParamSlot:
    """One trainable parameter's place: elements [start, start + numel) of buffer `buffer`."""

    name: str
    buffer: int
    bucket: int
    start: int
    numel: int


@dataclass(frozen=True)
class BucketSpec:
    """A contiguous, padded range [start, end) of one buffer, reduced by one collective."""

    index: int
    buffer: int
    start: int
    end: int
    slots: tuple[int, ...]
    """Indices into Layout.slots, in backward order."""

    @property
    def numel(self) -> int:
        return self.end - self.start

    def shard_range(self, rank: int, world_size: int) -> tuple[int, int]:
        """Buffer range that `rank` owns after a reduce-scatter of this bucket."""
        size = self.numel // world_size
        return self.start + rank * size, self.start + (rank + 1) * size


@dataclass(frozen=True)
class BufferSpec:
    """One contiguous buffer: all trainable parameters sharing a (param dtype, grad dtype) pair."""

    param_dtype: torch.dtype
    grad_dtype: torch.dtype
    numel: int


@dataclass(frozen=True)
class ShardPiece:
    """The part of one parameter that falls inside a rank's shard of a bucket."""

    slot: int
    param_start: int
    """First element, counted in the flattened parameter."""
    param_end: int
    shard_start: int
    """Where that element sits inside the rank's shard of the bucket."""

    @property
    def numel(self) -> int:
        return self.param_end - self.param_start


@dataclass(frozen=True)
class Layout:
    """Buffers, buckets (in launch order) and parameter slots (in backward order) for one world size."""

    world_size: int
    buffers: tuple[BufferSpec, ...]
    buckets: tuple[BucketSpec, ...]
    slots: tuple[ParamSlot, ...]

    def pieces(self, bucket: int, rank: int) -> list[ShardPiece]:
        """Parameter pieces inside `rank`'s shard of `bucket`, in buffer order."""
        spec = self.buckets[bucket]
        lo, hi = spec.shard_range(rank, self.world_size)
        found = []
        for index in spec.slots:
            slot = self.slots[index]
            first, last = max(lo, slot.start), min(hi, slot.start + slot.numel)
            if first < last:
                found.append(ShardPiece(index, first - slot.start, last - slot.start, first - lo))
        return found


class BucketedBuffers:
    """What the gradient side (`GradBuckets`) and the parameter side (`ParamGather`) share: per-dtype flat
    tensors `data` laid out by `layout`, split over the ranks of `comm` (its `rank` and `size`)."""

    layout: Layout
    comm: Any
    data: list[torch.Tensor]

    def bucket_view(self, bucket: int) -> torch.Tensor:
        """The whole bucket, padding included: what one collective moves."""
        spec = self.layout.buckets[bucket]
        return self.data[spec.buffer][spec.start : spec.end]

    def shard_view(self, bucket: int) -> torch.Tensor:
        """This rank's slice of a bucket: what it owns after a reduce-scatter and sends to an all-gather."""
        spec = self.layout.buckets[bucket]
        lo, hi = spec.shard_range(self.comm.rank, self.comm.size)
        return self.data[spec.buffer][lo:hi]


def _round_up(value: int, multiple: int) -> int:
    return -(-value // multiple) * multiple


def plan_layout(
    params: Sequence[tuple[str, torch.dtype, int]],
    *,
    world_size: int,
    bucket_elements: int | None,
    grad_dtype: torch.dtype | None,
) -> Layout:
    """Lay out (name, dtype, numel) triples given in registration order.

    Parameters are placed in reverse registration order (a proxy for the order backward produces their
    gradients); a bucket closes once it holds `bucket_elements` elements, and buckets are numbered in the order
    they close, which is the order their collectives must launch on every rank.
    """
    if world_size < 1:
        raise ValueError(f"world_size must be >= 1, got {world_size}")
    if not params:
        raise ValueError("no trainable parameters to lay out")
    pad = world_size * SHARD_ALIGN
    buffer_keys: list[tuple[torch.dtype, torch.dtype]] = []
    cursor: list[int] = []
    open_bucket: dict[int, tuple[int, list[int]]] = {}  # buffer -> (start, slot positions)
    slot_info: list[tuple[str, int, int, int]] = []  # name, buffer, start, numel
    closed: list[tuple[int, int, int, list[int]]] = []  # buffer, start, end, slot positions

    def close(buffer: int) -> None:
        start, members = open_bucket.pop(buffer)
        end = start + _round_up(cursor[buffer] - start, pad)
        cursor[buffer] = end
        closed.append((buffer, start, end, members))

    for name, dtype, numel in reversed(params):
        key = (dtype, grad_dtype or dtype)
        if key not in buffer_keys:
            buffer_keys.append(key)
            cursor.append(0)
        buffer = buffer_keys.index(key)
        start = _round_up(cursor[buffer], PARAM_ALIGN)
        open_bucket.setdefault(buffer, (start, []))[1].append(len(slot_info))
        slot_info.append((name, buffer, start, numel))
        cursor[buffer] = start + numel
        if bucket_elements is not None and cursor[buffer] - open_bucket[buffer][0] >= bucket_elements:
            close(buffer)
    # Remaining open buckets complete when their last parameter's gradient arrives: close them in that order.
    for buffer in sorted(open_bucket, key=lambda b: open_bucket[b][1][-1]):
        close(buffer)

    bucket_of = {}
    buckets = []
    for index, (buffer, start, end, members) in enumerate(closed):
        buckets.append(BucketSpec(index, buffer, start, end, tuple(members)))
        bucket_of.update(dict.fromkeys(members, index))
    slots = tuple(
        ParamSlot(name, buffer, bucket_of[i], start, numel)
        for i, (name, buffer, start, numel) in enumerate(slot_info)
    )
    buffers = tuple(BufferSpec(p, g, n) for (p, g), n in zip(buffer_keys, cursor))
    return Layout(world_size, buffers, tuple(buckets), slots)
