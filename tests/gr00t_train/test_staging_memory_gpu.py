"""Device memory of checkpoint saves on CUDA (run on a GPU host: `pytest tests/gr00t_train/test_staging_memory_gpu.py
-m gpu`): with the cyclic collector off, saves that copy the state on the device first hold one snapshot buffer
between them, the same one every save (allocated once), and nothing else; `close` gives it back. The peak
recorded per save is the memory before it plus that one buffer. The pool's registered host memory takes
asynchronous copies as pinned memory does, and is pageable again once released."""

from __future__ import annotations

import gc

import pytest
import torch
from gr00t_train.checkpoint.host_pool import HostPool
from gr00t_train.checkpoint.pinned import PinnedBytes
from gr00t_train.checkpoint.staging import Staging

pytestmark = pytest.mark.gpu


def test_saves_hold_one_snapshot_buffer_reused_and_freed_at_close() -> None:
    device = torch.device("cuda")
    state = {f"p{i}": {"master": torch.randn(1 << 22, device=device), "exp_avg": torch.randn(1 << 22, device=device)}
             for i in range(4)}  # fmt: skip
    size = sum(t.numel() * t.element_size() for entry in state.values() for t in entry.values())  # 128 MiB
    torch.cuda.synchronize()
    gc.collect()
    gc.disable()
    try:
        base = torch.cuda.memory_allocated(device)
        staging = Staging(device, device_copies=True)
        pointers = []
        for save in range(3):
            torch.cuda.reset_peak_memory_stats(device)
            staging.begin()
            staged = staging.copy(state, guarded=True)
            staging.finish()()
            assert staging.snapshot_bytes == size
            assert torch.equal(staged["p3"]["exp_avg"], state["p3"]["exp_avg"].cpu())
            pointers.append(staging.snapshot._buffer.data_ptr())
            # the buffer kept for the next save, nothing more (a cycle would keep one more per save)
            assert torch.cuda.memory_allocated(device) == base + size
            memory = staging.memory
            assert memory["snapshot"] * (1 << 30) == size
            grown = size if save == 0 else 0  # later saves reuse the buffer the first one allocated
            assert memory["allocated_before"] * (1 << 30) == base + size - grown
            assert memory["peak_after"] >= memory["allocated_before"] + grown / (1 << 30) - 1e-9
            for entry in state.values():  # training goes on
                for tensor in entry.values():
                    tensor.add_(1.0)
        assert pointers == [pointers[0]] * 3
        staging.close()
        assert torch.cuda.memory_allocated(device) == base
    finally:
        gc.enable()


def test_registered_host_memory_takes_asynchronous_copies_and_is_released() -> None:
    source = torch.randn(3 << 20, device="cuda")
    pinned = PinnedBytes((12 << 20) + 4096)  # not a power of two: the mapping is exactly what was asked
    assert pinned.tensor.numel() == (12 << 20) + 4096 and pinned.tensor.is_pinned()
    assert pinned.tensor.data_ptr() % 4096 == 0
    target = pinned.tensor[4096:].view(torch.float32)
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        target.copy_(source, non_blocking=True)
    stream.synchronize()
    assert torch.equal(target, source.cpu())
    pinned.release()
    pinned.release()  # once only
    assert not pinned.tensor.is_pinned() and torch.equal(target, source.cpu())  # still readable
    pool = HostPool(pinned=True)
    pool.reserve_for([1 << 20] * 3)
    slot = pool.take((1 << 18,), torch.float32)
    assert slot.is_pinned() and pool.pinned and len(pool.held_s) == 1
    pool.close()  # unregisters in a thread
    pool.join()
    assert not slot.is_pinned() and pool.release_s is not None
