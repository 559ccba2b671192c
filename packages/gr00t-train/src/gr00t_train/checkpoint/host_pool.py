"""Host memory that checkpoint staging copies into: allocated once, reused by every save, freed at the end.

Pinning host memory is slow (seconds for n1.6-3b's 19.4 GB of optimizer state), so the pool is not allocated
per save. It is a list of chunks (pinned on CUDA, `pinned.PinnedBytes`, so device-to-host
copies run asynchronously at full PCIe speed; plain memory on CPU); `reserve_in_background` fills it at
start-up from an estimate, beside training. A save takes its slots in order (`rewind`, then `take`): the
first chunk with room for the tensor holds it after the slots already taken there, else a new chunk. The
same sequence of tensors therefore lands in the same places every save. `reserve_for` reserves for a list of
tensor sizes by running that placement ahead, so the first save finds a slot for each of them (a reservation of
the total alone falls short: slots are page-aligned, a chunk's tail is left when the next tensor does not fit,
and a tensor over a quarter of a chunk gets one of its own).

Each slot is a tensor with a storage of its own, exactly its bytes (a NumPy view of the chunk made into a
tensor): torch.save writes each tensor, never the chunk around it, and safetensors sees no shared storage.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Sequence

import torch

from .pinned import PinnedBytes

log = logging.getLogger(__name__)

CHUNK_BYTES = 1 << 28
"""Bytes of one chunk for small tensors; a tensor over a quarter of this gets a chunk of exactly its own
(page-rounded) size, so a chunk's unused tail stays under a quarter of it. Chunks are registered memory
(`pinned.PinnedBytes`), not torch's pinned allocator, which rounds every allocation up to a power of two
(n1.6-3b's optimizer state holds tensors of ~135 MB: 1 GiB chunks left a third of them empty)."""
ALIGN = 4096
"""Slots start at multiples of this many bytes (page-aligned copies)."""
REST = 1.0
"""A background reservation sleeps this many times as long as each chunk's registration held the CUDA
driver. Pinned by torch's allocator, chunk after chunk, the driver was never let go: on an H100 (2026-12-06,
n1.6-3b, 23.6 GB in 11.5 s) the loop's first kernel launch after the first step waited for the whole
reservation, the GPU idle (step 1's end event 11-12 s late); resting as long as each 1 GiB chunk took still
lost 7.5 s of a 19 s loop (`benchmarks/probes/pinning_beside_steps.py`). Registering present pages holds it
for much less, and resting gives the loop's launches the driver in between."""


def _round_up(n: int, to: int) -> int:
    return -(-n // to) * to


def _new_chunk(need: int) -> int:
    """Bytes of the chunk `take` allocates for a slot of `need` bytes (page-rounded) that fits no chunk held."""
    return need if need > CHUNK_BYTES // 4 else CHUNK_BYTES


def plan_chunks(held: Sequence[int], sizes: Sequence[int]) -> list[int]:
    """The chunks to add to chunks of `held` bytes so that slots of `sizes` bytes, taken in order as `take`
    places them (first chunk with room, else a new one), need no further allocation."""
    capacity, fill, added = list(held), [0] * len(held), []
    for size in sizes:
        need = _round_up(size, ALIGN)
        chunk = next((c for c, taken in enumerate(fill) if taken + need <= capacity[c]), None)
        if chunk is None:
            added.append(_new_chunk(need))
            capacity.append(added[-1])
            fill.append(0)
            chunk = len(capacity) - 1
        fill[chunk] += need
    return added


def nbytes(shape: torch.Size | tuple[int, ...], dtype: torch.dtype) -> int:
    """Bytes of a contiguous tensor of `shape` and `dtype`."""
    numel = 1
    for size in shape:
        numel *= size
    return numel * torch.empty((), dtype=dtype).element_size()


class HostPool:
    """Chunks of (pinned) host memory and the slots a save takes from them (see the module docstring)."""

    def __init__(self, pinned: bool) -> None:
        self.pinned = pinned
        self._chunks: list[torch.Tensor] = []  # uint8, one storage each
        self._arrays: list = []  # NumPy views of the chunks: slots are cut from these
        self._pinned: list[PinnedBytes] = []  # the registrations of pinned chunks, released by close()
        self._fill: list[int] = []  # bytes taken from each chunk by this save
        self._lock = threading.Lock()
        self._reserving: threading.Thread | None = None
        self._releasing: threading.Thread | None = None
        self.grown = 0
        """Bytes allocated by `take` since the last `rewind`: a save that outgrew the reservation (in the loop)."""
        self.grow_s = 0.0
        """Seconds `take` spent allocating since the last `rewind` (pinning is slow: part of a save's stall)."""
        self.join_s = 0.0
        """Seconds the last `rewind` waited for the reservation still running in the background."""
        self.reserve_s: float | None = None
        """Seconds the last background reservation took (None before one has ended)."""
        self.held_s: list[float] = []
        """Seconds each pinned chunk's registration held the CUDA driver."""
        self.release_s: float | None = None
        """Seconds the last release of pinned chunks took (in its thread: `close`)."""

    @property
    def capacity(self) -> int:
        """Bytes held."""
        return sum(chunk.numel() for chunk in self._chunks)

    def _allocate(self, size: int) -> float:
        """Add a chunk of `size` bytes; returns the seconds it held the CUDA driver (its registration)."""
        held = 0.0
        try:
            if self.pinned:
                pinned = PinnedBytes(size)
                self._pinned.append(pinned)
                chunk, held = pinned.tensor, pinned.register_s
                self.held_s.append(held)
            else:
                chunk = torch.empty(size, dtype=torch.uint8)
        except RuntimeError as err:  # the host refused to pin more: copies into pageable memory still work
            log.warning("cannot pin %.2f GB more of host memory for checkpoints (%s); the rest is pageable, "
                        "so its copies block the loop", size / 1e9, err)  # fmt: skip
            self.pinned = False
            chunk = torch.empty(size, dtype=torch.uint8)
        self._chunks.append(chunk)
        self._arrays.append(chunk.numpy())
        self._fill.append(0)
        return held

    def reserve(self, total: int) -> None:
        """Hold at least `total` bytes in chunks."""
        with self._lock:
            while self.capacity < total:
                self._allocate(min(CHUNK_BYTES, _round_up(total - self.capacity, ALIGN)))

    def reserve_for(self, sizes: Sequence[int], rest: float = 0.0) -> None:
        """Hold the chunks that slots of `sizes` bytes, taken in this order after a `rewind`, fit in; after
        each chunk, sleeping `rest` times as long as it took (`reserve_in_background`)."""
        with self._lock:
            for size in plan_chunks([c.numel() for c in self._chunks], sizes):
                time.sleep(rest * self._allocate(size))

    def reserve_in_background(self, sizes: Sequence[int], rest: float = REST) -> None:
        """`reserve_for(sizes, rest)` in a daemon thread (pinning is slow; the loop goes on); `rewind` waits
        for it."""
        self.join()

        def run() -> None:
            started = time.perf_counter()
            try:
                self.reserve_for(sizes, rest)
                self.reserve_s = time.perf_counter() - started
                log.info("checkpoint staging: %.1f GB of %s host memory reserved in %.1f s (in the background)",
                         self.capacity / 1e9, "pinned" if self.pinned else "pageable", self.reserve_s)  # fmt: skip
            except Exception as err:  # noqa: BLE001 - the first save allocates what is missing instead
                log.warning(
                    "could not reserve %.1f GB of host memory for checkpoints: %s", sum(sizes) / 1e9, err
                )

        self._reserving = threading.Thread(target=run, name="gr00t-train-host-pool", daemon=True)
        self._reserving.start()

    def join(self) -> None:
        """Wait for a reservation, or a release (`close`), in progress."""
        for thread in (self._reserving, self._releasing):
            if thread is not None:
                thread.join()
        self._reserving = self._releasing = None

    def rewind(self) -> None:
        """A save starts: its slots are taken from the start again (the previous save's write has ended)."""
        started = time.perf_counter()
        self.join()
        self.join_s = time.perf_counter() - started
        self._fill, self.grown, self.grow_s = [0] * len(self._chunks), 0, 0.0

    def take(self, shape: torch.Size | tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
        """The next slot: a contiguous tensor of `shape` and `dtype` in a storage of its own (its contents
        are whatever the slot held before)."""
        size = nbytes(shape, dtype)
        need = _round_up(size, ALIGN)
        with self._lock:
            chunk = next(
                (c for c, taken in enumerate(self._fill) if taken + need <= self._chunks[c].numel()), None
            )
            if chunk is None:
                started = time.perf_counter()
                self._allocate(_new_chunk(need))
                self.grow_s += time.perf_counter() - started
                self.grown += self._chunks[-1].numel()
                chunk = len(self._chunks) - 1
            offset = self._fill[chunk]
            self._fill[chunk] += need
            raw = torch.from_numpy(self._arrays[chunk][offset : offset + size])
        return raw.view(dtype).view(shape)

    def close(self) -> None:
        """Free every chunk. Unregistering pinned memory is slow (n1.6-3b's 23.6 GB: 5 s on an H100 host,
        2026-12-06), so a thread does it beside what the process does next (the run's summary); not a daemon:
        the interpreter waits for it at exit, and `join` waits for it."""
        self.join()
        with self._lock:
            pinned = self._pinned
            self._chunks, self._arrays, self._fill, self._pinned = [], [], [], []
        if pinned:
            self._releasing = threading.Thread(
                target=self._release, args=(pinned,), name="gr00t-train-host-pool-release"
            )
            self._releasing.start()

    def _release(self, pinned: list[PinnedBytes]) -> None:
        started = time.perf_counter()
        for chunk in pinned:
            chunk.release()
        pinned.clear()  # the mappings go with the last tensors viewing them
        self.release_s = time.perf_counter() - started
        log.info("checkpoint staging: host memory unregistered in %.1f s", self.release_s)
