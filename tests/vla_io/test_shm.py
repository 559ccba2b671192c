"""Shared-memory arenas: a batch is laid out in one arena, sent once, rebuilt as views, reused after release."""

from __future__ import annotations

import pytest
import torch
from vla_io.pipeline.shm import ALIGN, ArenaAllocator, ArenaViews, TensorRef


def _batch(arenas: ArenaAllocator, n: int, fill: int) -> dict:
    frames = arenas.empty((n, 3, 8, 8), torch.uint8)
    frames.fill_(fill)
    return {
        "frames": frames,
        "state": torch.full((n, 5), float(fill)),  # not in the arena: packing copies it in
        "pad": torch.zeros(n, 4, dtype=torch.bool),
        "task": [f"t{fill}"] * n,
    }


def _roundtrip(arenas: ArenaAllocator, views: ArenaViews, key, n: int, fill: int):
    arenas.begin()
    packed = arenas.pack(_batch(arenas, n, fill))
    arenas.end(key)
    return packed, views.unpack(packed)


def test_batches_travel_as_references_into_one_reused_arena():
    arenas, views = ArenaAllocator(worker=3), ArenaViews()
    first, got = _roundtrip(arenas, views, "a", 4, 7)
    assert all(isinstance(first.batch[k], TensorRef) for k in ("frames", "state", "pad"))
    assert first.batch["task"] == ["t7"] * 4 and len(first.storages) >= 1
    assert torch.equal(got["frames"], torch.full((4, 3, 8, 8), 7, dtype=torch.uint8))
    assert torch.equal(got["state"], torch.full((4, 5), 7.0)) and got["pad"].dtype == torch.bool
    assert all(first.batch[k].offset % ALIGN == 0 for k in ("frames", "state", "pad"))
    arenas.release("a")
    for i, key in enumerate("bcdef"):  # steady state: the same arena, no storage sent again
        packed, got = _roundtrip(arenas, views, key, 4, 10 + i)
        assert packed.storages == {} and packed.retired == []
        assert torch.equal(got["state"], torch.full((4, 5), 10.0 + i))
        arenas.release(key)
    assert arenas.created == len(views) == 1


def test_leased_arenas_are_not_overwritten_and_grow_with_the_batch():
    arenas, views = ArenaAllocator(), ArenaViews()
    _, a = _roundtrip(arenas, views, "a", 2, 1)
    _, b = _roundtrip(arenas, views, "b", 2, 2)  # "a" not released: a second arena
    assert a["frames"].untyped_storage().data_ptr() != b["frames"].untyped_storage().data_ptr()
    assert int(a["frames"].max()) == 1 and int(b["frames"].max()) == 2
    arenas.release("a")
    arenas.release("b")
    big, got = _roundtrip(arenas, views, "c", 2000, 3)  # larger than any arena: a new one
    assert big.storages and torch.equal(got["state"], torch.full((2000, 5), 3.0))
    arenas.release("c")
    after, got = _roundtrip(arenas, views, "d", 2, 4)
    assert sorted(after.retired) == [0, 1] and not after.storages  # the small arenas were dropped...
    assert len(views) == 1 and int(got["frames"].max()) == 4  # ...and forgotten by the main process


def test_without_recycling_every_batch_gets_its_own_storage():
    arenas, views = ArenaAllocator(recycle=False), ArenaViews()
    kept = []
    for i in range(3):
        packed, got = _roundtrip(arenas, views, i, 2, i)
        arenas.release(i)  # no effect: nothing is reused
        assert packed.storages and not packed.keep
        kept.append(got)
    assert len(views) == 0 and arenas.created == 3
    assert [int(b["frames"].max()) for b in kept] == [0, 1, 2]


def test_empty_needs_a_batch():
    with pytest.raises(RuntimeError, match="begin"):
        ArenaAllocator().empty((2,), torch.float32)


def test_views_report_the_arenas_they_keep_and_drop():
    kept, dropped = [], []
    arenas = ArenaAllocator()
    views = ArenaViews(
        on_keep=lambda s: kept.append(s.data_ptr()), on_drop=lambda s: dropped.append(s.data_ptr())
    )
    _roundtrip(arenas, views, "a", 2, 1)
    arenas.release("a")
    _roundtrip(arenas, views, "b", 2000, 2)  # outgrows the first arena: it is retired...
    arenas.release("b")
    _roundtrip(arenas, views, "c", 2, 3)  # ...and the main process hears it with the next batch
    assert len(kept) == 2 and dropped == kept[:1]
    views.clear()
    assert dropped == kept and len(views) == 0
