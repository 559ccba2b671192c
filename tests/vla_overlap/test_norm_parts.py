"""DistributedAdamW(norm_in_backward=True): the gradient norm's per-bucket parts taken as the backward reduces
each bucket give the norm taken after the backward bit for bit (the same kernel on the same shards, combined
the same way), and so the same clipped trajectory; buckets on a narrower wire fall back to the pass after the
backward."""

from __future__ import annotations

import pytest
import torch


@pytest.mark.parametrize("world_size", [1, 2])
def test_the_norm_from_parts_taken_in_the_backward_is_the_norm(pool, world_size: int) -> None:
    for result in pool.run("norm_in_backward", world_size):
        after, parts = result["False"], result["True"]
        assert after["norms"][0] > 0.05, "the clip threshold must actually clip"
        assert parts["norms"] == after["norms"]  # Python floats of fp32 norms: bitwise
        for name, value in after["params"].items():
            assert torch.equal(parts["params"][name], value), name
        assert after["passes_after_backward"] == 3
        assert parts["passes_after_backward"] == 0  # every step combined the parts
        assert parts["buckets"] > 1


def test_buckets_on_a_narrower_wire_take_the_norm_after_the_backward(pool) -> None:
    for result in pool.run("norm_in_backward", 2, reduce_dtype="bfloat16"):
        after, parts = result["False"], result["True"]
        assert parts["norms"] == after["norms"]
        assert parts["passes_after_backward"] == 3


@pytest.mark.parametrize("world_size", [1, 2])
def test_gradients_written_by_hand_get_their_parts_when_the_sync_finishes(pool, world_size: int) -> None:
    for result in pool.run("norm_in_backward_by_hand", world_size):
        assert result["parts_taken"]
        assert result["from_parts"] == result["after_backward"] > 0
