"""Registered host memory (`checkpoint.pinned.PinnedBytes`) without a GPU: CUDA's runtime is a stand-in that
records the calls. The mapping is exactly the bytes asked, page-aligned, zeroed and writable before it is
registered; release unregisters once and leaves it readable; a refused registration raises, and the pool
then falls back to pageable memory with a warning. On a GPU: test_staging_memory_gpu.py."""

from __future__ import annotations

import logging

import pytest
import torch
from gr00t_train.checkpoint import host_pool, pinned
from gr00t_train.checkpoint.host_pool import HostPool
from gr00t_train.checkpoint.pinned import PinnedBytes


class FakeRuntime:
    """torch.cuda.cudart() as PinnedBytes calls it; `error` is what cudaHostRegister returns."""

    def __init__(self, error: int = 0) -> None:
        self.error, self.registered, self.unregistered = error, [], []

    def cudaHostRegister(self, ptr: int, size: int, flags: int) -> int:  # noqa: N802 - CUDA's name
        self.registered.append((ptr, size, flags))
        return self.error

    def cudaHostUnregister(self, ptr: int) -> int:  # noqa: N802 - CUDA's name
        self.unregistered.append(ptr)
        return 0


@pytest.fixture
def runtime(monkeypatch) -> FakeRuntime:
    fake = FakeRuntime()
    monkeypatch.setattr(torch.cuda, "cudart", lambda: fake)
    return fake


@pytest.mark.parametrize("populate", [True, False], ids=["madvise-populates", "pages-touched"])
def test_the_mapping_is_exactly_the_bytes_asked_zeroed_and_registered_once(
    runtime, monkeypatch, populate
) -> None:
    if not populate:  # a kernel older than 5.14 refuses MADV_POPULATE_WRITE
        monkeypatch.setattr(pinned, "_madvise", lambda tensor, advice: False)
    size = (3 << 20) + 4096  # not a power of two
    chunk = PinnedBytes(size)
    ptr = chunk.tensor.data_ptr()
    assert chunk.tensor.numel() == size and chunk.tensor.dtype == torch.uint8
    assert ptr % 4096 == 0 and not chunk.tensor.any()
    assert runtime.registered == [(ptr, size, 0)] and chunk.register_s >= 0.0
    chunk.tensor[-5:] = 7
    chunk.release()
    chunk.release()  # once only
    assert runtime.unregistered == [ptr]
    assert chunk.tensor[-5:].tolist() == [7] * 5  # still readable: the mapping lives with the tensor


def test_a_refused_registration_raises_and_the_pool_falls_back_to_pageable_memory(
    monkeypatch, caplog
) -> None:
    monkeypatch.setattr(torch.cuda, "cudart", lambda: FakeRuntime(error=2))
    with pytest.raises(RuntimeError, match="cudaHostRegister of 8192 bytes returned 2"):
        PinnedBytes(8192)
    pool = HostPool(pinned=True)
    with caplog.at_level(logging.WARNING, logger=host_pool.__name__):
        pool.reserve(1 << 20)
    assert not pool.pinned and pool.capacity == 1 << 20 and pool.held_s == []
    assert "cannot pin" in caplog.text
    slot = pool.take((16,), torch.float32)
    assert slot.numel() == 16 and not slot.is_pinned()
    pool.close()
