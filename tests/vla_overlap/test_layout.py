"""Buffer layout: reverse registration order, bucket cuts, alignment, padding and shard coverage."""

from __future__ import annotations

import pytest
import torch
from vla_overlap import plan_layout
from vla_overlap._layout import PARAM_ALIGN, SHARD_ALIGN

PARAMS = [
    ("a", torch.float32, 100),
    ("b", torch.float32, 1000),
    ("c", torch.bfloat16, 70),
    ("d", torch.float32, 5),
]


def test_parameters_are_laid_out_in_reverse_registration_order() -> None:
    layout = plan_layout(PARAMS, world_size=1, bucket_elements=None, grad_dtype=None)
    assert [s.name for s in layout.slots] == ["d", "c", "b", "a"]
    fp32 = [s for s in layout.slots if s.buffer == layout.slots[0].buffer]
    assert [s.start for s in fp32] == sorted(s.start for s in fp32)


def test_dtypes_get_separate_buffers_unless_one_grad_dtype_is_forced() -> None:
    mixed = plan_layout(PARAMS, world_size=1, bucket_elements=None, grad_dtype=None)
    pairs = {(b.param_dtype, b.grad_dtype) for b in mixed.buffers}
    assert pairs == {(torch.float32, torch.float32), (torch.bfloat16, torch.bfloat16)}
    forced = plan_layout(PARAMS, world_size=1, bucket_elements=None, grad_dtype=torch.float32)
    assert {b.grad_dtype for b in forced.buffers} == {torch.float32}
    assert {b.param_dtype for b in forced.buffers} == {torch.float32, torch.bfloat16}


def test_a_bucket_closes_once_it_reaches_bucket_elements_and_never_splits_a_parameter() -> None:
    params = [(f"p{i}", torch.float32, 300) for i in range(6)]
    layout = plan_layout(params, world_size=2, bucket_elements=500, grad_dtype=None)
    # 300 (aligned to 320) + 300 >= 500 closes: two parameters per bucket.
    assert [len(b.slots) for b in layout.buckets] == [2, 2, 2]
    for bucket in layout.buckets:
        for index in bucket.slots:
            slot = layout.slots[index]
            assert bucket.start <= slot.start and slot.start + slot.numel <= bucket.end
            assert slot.bucket == bucket.index


def test_buckets_are_numbered_in_completion_order_across_buffers() -> None:
    params = [("x32", torch.float32, 10), ("y16", torch.bfloat16, 10), ("z32", torch.float32, 10)]
    layout = plan_layout(params, world_size=1, bucket_elements=None, grad_dtype=None)
    # Backward order z32, y16, x32: the bf16 bucket completes (y16) before the fp32 one (x32).
    assert [layout.buffers[b.buffer].param_dtype for b in layout.buckets] == [torch.bfloat16, torch.float32]


@pytest.mark.parametrize("world_size", [1, 2, 3, 4])
@pytest.mark.parametrize("bucket_elements", [None, 1, 700])
def test_alignment_padding_and_shards_cover_every_element_once(
    world_size: int, bucket_elements: int | None
) -> None:
    layout = plan_layout(
        PARAMS, world_size=world_size, bucket_elements=bucket_elements, grad_dtype=torch.float32
    )
    for slot in layout.slots:
        assert slot.start % PARAM_ALIGN == 0
    for bucket in layout.buckets:
        assert bucket.numel % (world_size * SHARD_ALIGN) == 0
    covered = {s: torch.zeros(s.numel, dtype=torch.int32) for s in layout.slots}
    for bucket in layout.buckets:
        for rank in range(world_size):
            lo, hi = bucket.shard_range(rank, world_size)
            for piece in layout.pieces(bucket.index, rank):
                slot = layout.slots[piece.slot]
                assert (
                    lo + piece.shard_start == slot.start + piece.param_start
                )  # same element, two coordinates
                assert lo + piece.shard_start + piece.numel <= hi
                covered[slot][piece.param_start : piece.param_end] += 1
    assert all(bool((c == 1).all()) for c in covered.values())


def test_buffers_do_not_overlap() -> None:
    layout = plan_layout(PARAMS, world_size=3, bucket_elements=200, grad_dtype=None)
    for buffer in range(len(layout.buffers)):
        ranges = sorted((b.start, b.end) for b in layout.buckets if b.buffer == buffer)
        assert all(a_end <= b_start for (_, a_end), (b_start, _) in zip(ranges, ranges[1:]))
        assert ranges[-1][1] == layout.buffers[buffer].numel


def test_bad_arguments() -> None:
    with pytest.raises(ValueError, match="no trainable parameters"):
        plan_layout([], world_size=1, bucket_elements=None, grad_dtype=None)
    with pytest.raises(ValueError, match="world_size"):
        plan_layout(PARAMS, world_size=0, bucket_elements=None, grad_dtype=None)
