"""The device buffer a save copies the optimizer state into first (`checkpoint.staging`), kept from one save to
the next.

One buffer serves every save: the first save that has room allocates it (19.4 GB for n1.6-3b; later saves
allocate nothing), a save whose state grew past it replaces it, and a save that finds no room for it any more
frees it (the steps get the memory back; that save's host copies read the originals instead). Between saves
it stays allocated: the steps' peak after the first save includes it (summary.json reports the steps' peak
before the first save and each save's memory apart: `checkpoint.async_save.SaveLog`).

The state's tensors are laid out back to back, each at a multiple of `ALIGN` bytes (`layout`), so the same
state lands in the same places every save.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence

import torch

from .host_pool import ALIGN, nbytes


def layout(tensors: Sequence[torch.Tensor]) -> tuple[list[int], int]:
    """(byte offset of each tensor, total bytes) of `tensors` laid out back to back, ALIGN-aligned."""
    places, total = [], 0
    for tensor in tensors:
        places.append(total)
        total += -(-nbytes(tensor.shape, tensor.dtype) // ALIGN) * ALIGN
    return places, total


class SnapshotBuffer:
    """One uint8 buffer on `device`, reused by every save that fits in it (see the module docstring)."""

    def __init__(self, device: torch.device, room: Callable[[], int]) -> None:
        self.device = device
        self._room = room  # bytes a new allocation may take now (checkpoint.staging.device_room)
        self._buffer: torch.Tensor | None = None
        self.allocated = 0
        """Bytes the last `take` allocated (0: it reused the buffer, or found no room)."""
        self.alloc_s = 0.0
        """Seconds the last `take` spent allocating (the caching allocator's first cudaMalloc of it)."""

    @property
    def held(self) -> int:
        """Bytes held between saves."""
        return 0 if self._buffer is None else self._buffer.numel()

    def fits(self, total: int) -> bool:
        """Whether a snapshot of `total` bytes has room: in the buffer held, or in the device's free memory
        counting the buffer held as free (it would be replaced)."""
        return total <= self.held or self._room() + self.held >= total

    def take(self, total: int) -> torch.Tensor | None:
        """A buffer of at least `total` bytes: the one held when large enough, else a new one (the one held is
        freed first). None when the device refused it (out of memory): nothing is held then."""
        self.allocated, self.alloc_s = 0, 0.0
        if self._buffer is not None and self._buffer.numel() >= total:
            return self._buffer
        self.release()
        started = time.perf_counter()
        try:
            self._buffer = torch.empty(total, dtype=torch.uint8, device=self.device)
        except torch.OutOfMemoryError:
            return None
        self.alloc_s = time.perf_counter() - started
        self.allocated = total
        return self._buffer

    def fill(self, tensors: Sequence[torch.Tensor], buffer: torch.Tensor) -> dict[int, torch.Tensor]:
        """Copies of `tensors` in `buffer`, on the current stream: id of each original -> its copy."""
        places, _ = layout(tensors)
        copies = {}
        for tensor, at in zip(tensors, places):
            size = nbytes(tensor.shape, tensor.dtype)
            copies[id(tensor)] = buffer[at : at + size].view(tensor.dtype).view(tensor.shape).copy_(tensor)
        return copies

    def release(self) -> None:
        """Free the buffer (the device memory goes back to the caching allocator)."""
        self._buffer = None
