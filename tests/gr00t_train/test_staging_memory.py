"""What a save holds and allocates (CPU): staging leaves no reference cycle (one kept every save's device snapshot
alive until Python's cyclic collector ran: four saves of n1.6-3b held four 19.4 GB snapshots); the host pool's
reservation for a list of sizes leaves the first save nothing to allocate, where a reservation of their total
does not; the snapshot buffer is reused across saves, replaced when the state outgrows it and freed when the
device has no room for it, and stays inside the allocator's cap and memory.budget_gib; a run's first save finds
its slots reserved, and each save's stall is split into parts that add up to it. The CUDA side:
test_staging_gpu.py."""

from __future__ import annotations

import gc

import pytest
import torch
from gr00t_train.checkpoint import host_pool
from gr00t_train.checkpoint import staging as staging_module
from gr00t_train.checkpoint.host_pool import ALIGN, HostPool, plan_chunks
from gr00t_train.checkpoint.snapshot import SnapshotBuffer, layout
from gr00t_train.checkpoint.staging import Staging, device_room

MiB = 1 << 20
GiB = 1 << 30


@pytest.fixture
def no_cyclic_collection():
    """The cyclic collector off for the test (a cycle then stays unreachable until `gc.collect()`)."""
    gc.collect()
    gc.disable()
    yield
    gc.enable()


def test_staging_a_save_leaves_nothing_for_the_cyclic_collector(no_cyclic_collection) -> None:
    staging = Staging(torch.device("cpu"))
    for guarded in (True, False):
        staging.begin()
        staged = staging.copy(
            {"a": torch.ones(3), "b": [torch.zeros(2), (torch.arange(4),)], "n": 1}, guarded=guarded
        )
        staging.finish()()
        assert torch.equal(staged["b"][1][0], torch.arange(4))
        assert gc.collect() == 0  # nothing unreachable: every copy is freed as soon as the save drops it
    staging.close()


def test_a_reservation_for_the_sizes_leaves_the_first_save_nothing_to_allocate(monkeypatch) -> None:
    monkeypatch.setattr(host_pool, "CHUNK_BYTES", 1 * MiB)  # small chunks: the same placement, in MiB
    # small slots, a slot larger than a chunk, slots that leave a chunk's tail unused
    sizes = [100] * 5 + [3 * MiB] + [600 * 1024] * 5 + [MiB // 2 + 1] + [100] * 3
    assert plan_chunks([], []) == []
    assert plan_chunks([], [3 * MiB]) == [3 * MiB]  # a chunk of exactly its own size
    assert plan_chunks([], [MiB // 4 + 1]) == [MiB // 4 + ALIGN]  # over a quarter of a chunk: its own too
    assert plan_chunks([], [MiB // 4] * 5) == [MiB, MiB]  # up to a quarter: shared chunks
    for reserve in ("total", "sizes"):
        pool = HostPool(pinned=False)
        pool.reserve(sum(sizes)) if reserve == "total" else pool.reserve_for(sizes)
        pool.rewind()
        for size in sizes:
            pool.take((size,), torch.uint8)
        if reserve == "total":  # the total falls short: alignment, chunk tails, the large slot
            assert pool.grown > 0 and pool.grow_s > 0
        else:
            assert pool.grown == 0 and pool.grow_s == 0.0
            assert pool.capacity == sum(plan_chunks([], sizes))
        pool.close()
    held = [MiB, MiB]  # a reservation for what is already held adds nothing
    assert plan_chunks(held, [MiB // 2] * 4) == []
    assert plan_chunks(held, [MiB // 2] * 5) == [MiB // 2]  # the fifth half-chunk slot: one of its own


def test_the_pool_for_n16_3b_sized_state_holds_little_more_than_the_state() -> None:
    # The checkpoint-stall probe's state: 48 layers of 33.75 M elements, fp32 master and two moments each
    # (135 MB slots), and 2.7 GB of frozen bf16 weights in 27 tensors. Chunk tails are the only waste.
    sizes = [135_000_000] * (48 * 3) + [100_000_000] * 27
    planned = sum(plan_chunks([], sizes))
    assert sum(sizes) < planned <= 1.15 * sum(sizes), planned / sum(sizes)


def test_the_snapshot_buffer_is_reused_replaced_when_outgrown_and_freed_without_room() -> None:
    room = {"bytes": 10 * MiB}
    snapshot = SnapshotBuffer(torch.device("cpu"), lambda: room["bytes"])
    tensors = [torch.ones(1000), torch.zeros(3, 5, dtype=torch.bfloat16), torch.arange(7)]
    places, total = layout(tensors)
    assert places == [0, ALIGN, 2 * ALIGN] and total == 3 * ALIGN
    assert snapshot.fits(total) and snapshot.held == 0
    first = snapshot.take(total)
    assert snapshot.allocated == total and snapshot.held == total
    copies = snapshot.fill(tensors, first)
    for tensor in tensors:
        assert torch.equal(copies[id(tensor)], tensor)
        assert copies[id(tensor)].untyped_storage().data_ptr() == first.untyped_storage().data_ptr()
    again = snapshot.take(total)  # the next save: the same buffer, nothing allocated
    assert again.data_ptr() == first.data_ptr() and snapshot.allocated == 0
    room["bytes"] = 0  # the held buffer still fits what it held before
    assert snapshot.fits(total) and not snapshot.fits(total + 1)
    room["bytes"] = 2 * total  # room counts the held buffer as free: 2 total + total held
    assert snapshot.fits(3 * total) and not snapshot.fits(3 * total + 1)
    grown = snapshot.take(2 * total)
    assert snapshot.allocated == 2 * total and snapshot.held == 2 * total and grown.numel() == 2 * total
    snapshot.release()
    assert snapshot.held == 0


@pytest.mark.parametrize("comm", ["ddp", "zero1_overlap"])
def test_a_runs_first_save_finds_its_slots_reserved_and_its_stall_is_split_into_parts(
    tmp_path, env, standins, monkeypatch, comm
) -> None:
    from gr00t_train import Trainer

    # chunks sized to their slots: the reservation's order must match the save's
    monkeypatch.setattr(host_pool, "CHUNK_BYTES", 1 << 12)
    cfg = standins.small_config(tmp_path, steps=4, checkpoint__every=2, optimizations__comm=comm)
    trainer = Trainer(cfg, standins.make_parts(), env)
    trainer.fit()
    saves = trainer.checkpoint.saves
    assert len(saves.stall_parts_s) == len(saves.stall_s) == 2
    for stall, parts in zip(saves.stall_s, saves.stall_parts_s):
        laps = {k: v for k, v in parts.items() if k != "staging"}
        assert list(laps)[:6] == [
            "settle",
            "finite_check",
            "rank_state",
            "optimizer",
            "model_tensors",
            "folder",
        ]
        assert sum(laps.values()) == pytest.approx(stall, abs=1e-6)
        assert parts["staging"]["pool_grow"] == 0.0  # the reservation held every slot, the first save's too
    facts = trainer.last_summary and trainer.run_facts()
    assert len(facts["checkpoint_stall_parts_s"]) == 2
    assert facts["checkpoint_memory_gib"] == [] and facts["peak_memory_before_saves_gib"] is None  # CPU


def _fraction(value: float):
    """torch.cuda.get_per_process_memory_fraction as it checks its argument: an index, or a device naming one."""

    def fraction(device: int | torch.device) -> float:
        if isinstance(device, torch.device) and device.index is None:
            raise ValueError(
                f"Expected a torch.device with a specified index or an integer, but got:{device}"
            )
        return value

    return fraction


def test_a_snapshot_stays_inside_the_allocator_cap_and_the_memory_budget(monkeypatch) -> None:
    # A 141 GiB device with 100 GiB free; the steps peaked at 30 GiB, 20 GiB allocated now (between steps).
    cuda = torch.cuda
    monkeypatch.setattr(cuda, "mem_get_info", lambda device=None: (100 * GiB, 141 * GiB))
    monkeypatch.setattr(cuda, "memory_reserved", lambda device=None: 32 * GiB)
    monkeypatch.setattr(cuda, "max_memory_allocated", lambda device=None: 30 * GiB)
    monkeypatch.setattr(cuda, "current_device", lambda: 0)
    monkeypatch.setattr(cuda, "get_per_process_memory_fraction", _fraction(1.0), raising=False)
    device = torch.device("cuda")
    margin = staging_module.SNAPSHOT_MARGIN
    assert device_room(device) == 100 * GiB + 32 * GiB - 30 * GiB - margin  # the device's free memory
    assert device_room(device, budget_bytes=40 * GiB) == 10 * GiB - margin  # memory.budget_gib=40
    capped = 48 * GiB / (141 * GiB)  # the allocator capped at 48 GiB (a smaller card emulated)
    monkeypatch.setattr(cuda, "get_per_process_memory_fraction", _fraction(capped), raising=False)
    assert abs(device_room(device) - (18 * GiB - margin)) < 1024
    assert abs(device_room(device, budget_bytes=40 * GiB) - (10 * GiB - margin)) < 1024


def test_a_background_reservation_rests_as_long_as_each_registration_held_the_driver(monkeypatch) -> None:
    """Registering pinned memory holds the CUDA driver: between chunks the loop gets it back
    (`host_pool.REST`); close() unregisters every chunk."""

    class Registered:  # pinned.PinnedBytes without CUDA: pageable bytes, a registration of 0.25 s
        def __init__(self, size: int) -> None:
            self.tensor, self.register_s, self.released = torch.empty(size, dtype=torch.uint8), 0.25, False

        def release(self) -> None:
            self.released = True

    slept = []
    monkeypatch.setattr(host_pool.time, "sleep", slept.append)
    monkeypatch.setattr(host_pool, "PinnedBytes", Registered)
    pool = HostPool(pinned=True)
    pool.reserve_in_background([host_pool.CHUNK_BYTES // 4] * 6)  # two chunks (never touched)
    pool.join()
    assert slept == [0.25 * host_pool.REST] * 2 and pool.held_s == [0.25, 0.25]
    registrations = list(pool._pinned)
    pool.close()  # unregisters in a thread
    pool.join()
    assert len(registrations) == 2 and all(r.released for r in registrations)
    pool.reserve_for([4096])  # in the caller's thread: no rest
    assert slept[2:] == [0.0]
