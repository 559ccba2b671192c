"""Pinned host memory that holds the CUDA driver only briefly: pages faulted in first, then registered.

torch's pinned allocator (cudaHostAlloc) allocates, zeroes and pins a chunk inside one driver call, and the
driver is held for all of it: on an H100 host (2026-12-06) a 1 GiB chunk took ~0.5 s, during which every kernel
launch of the training loop waited (`benchmarks/probes/pinning_beside_steps.py`). Here the memory is an
anonymous mapping (page-aligned, exactly the bytes asked: no rounding up to a power of two), its pages are
faulted in by this thread (madvise MADV_POPULATE_WRITE, else writing zeros), asking for transparent huge pages
where the kernel offers them, and only then registered (cudaHostRegister), which pins pages already present.
Device-to-host copies into it are asynchronous like any pinned memory (`Tensor.is_pinned()` is True).
"""

from __future__ import annotations

import ctypes
import mmap
import time

import torch

MADV_HUGEPAGE = 14
MADV_POPULATE_WRITE = 23
"""Linux 5.14+: fault in (and zero) every page of a range in one call; older kernels say EINVAL."""
_libc = ctypes.CDLL(None, use_errno=True)  # ctypes lets go of the GIL during the call: the loop runs on


def _madvise(tensor: torch.Tensor, advice: int) -> bool:
    return _libc.madvise(ctypes.c_void_p(tensor.data_ptr()), ctypes.c_size_t(tensor.numel()), advice) == 0


class PinnedBytes:
    """`size` bytes of registered host memory as a uint8 tensor; `register_s`: the seconds the registration
    (the part that holds the driver) took. `release()` unregisters it (before the mapping goes away with the
    last tensor viewing it)."""

    def __init__(self, size: int) -> None:
        self._map = mmap.mmap(-1, size)
        self.tensor = torch.frombuffer(self._map, dtype=torch.uint8)  # keeps the mapping alive
        _madvise(self.tensor, MADV_HUGEPAGE)  # fewer pages to pin and map where THP is on
        if not _madvise(self.tensor, MADV_POPULATE_WRITE):
            self.tensor.zero_()  # an older kernel: touch every page instead (zero_ lets go of the GIL too)
        started = time.perf_counter()
        error = torch.cuda.cudart().cudaHostRegister(self.tensor.data_ptr(), size, 0)
        self.register_s = time.perf_counter() - started
        if int(error) != 0:  # e.g. the locked-memory limit
            raise RuntimeError(f"cudaHostRegister of {size} bytes returned {error}")
        self._registered = True

    def release(self) -> None:
        """Unregister (once); the memory stays valid, pageable, while some tensor still views it."""
        if self._registered:
            self._registered = False
            torch.cuda.cudart().cudaHostUnregister(self.tensor.data_ptr())
