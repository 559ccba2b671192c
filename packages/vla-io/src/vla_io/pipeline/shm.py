"""Shared memory between pipeline workers and the main process: each batch is laid out in an arena (one
shared storage) that is sent to the main process once and then reused, so a batch travels as a few hundred
bytes of (arena, offset, shape, dtype) records.

Why: torch sends a storage between processes as a file descriptor, over a fresh authenticated socket
connection to the sending process, and maps it on arrival. Done for every tensor of every batch (about ten
per batch) this costs CPU on both sides and, worse, a round trip that waits for the worker's threads to be
scheduled: on a loaded machine the main thread spends milliseconds per tensor receiving batches.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

ALIGN = 64  # bytes; every tensor starts on a cache line, so any dtype's element offset is whole
_MIN_ARENA = 1 << 16


def _aligned(nbytes: int) -> int:
    return -(-nbytes // ALIGN) * ALIGN


def new_shared_storage(nbytes: int) -> torch.UntypedStorage:
    """An uninitialised shared-memory storage."""
    try:  # the allocator torch's own default_collate uses in workers
        return torch.UntypedStorage._new_shared(nbytes)
    except (AttributeError, RuntimeError):
        return torch.empty(nbytes, dtype=torch.uint8).share_memory_().untyped_storage()


def _view(storage: torch.UntypedStorage, offset: int, dtype: torch.dtype, shape, stride=None) -> torch.Tensor:
    out = torch.empty(0, dtype=dtype)
    if stride is None:
        return out.set_(storage, offset // dtype.itemsize, shape)
    return out.set_(storage, offset // dtype.itemsize, shape, stride)


@dataclass(frozen=True)
class TensorRef:
    """Where a tensor of a packed batch lives: an arena of the sending worker, a byte offset, its layout."""

    arena: int
    offset: int
    shape: tuple[int, ...]
    stride: tuple[int, ...]
    dtype: torch.dtype


@dataclass
class Packed:
    """A batch as sent by a worker: values with tensors replaced by `TensorRef`s."""

    worker: int
    batch: dict[str, Any]
    storages: dict[int, torch.UntypedStorage] = field(default_factory=dict)  # arenas sent this time
    retired: list[int] = field(default_factory=list)  # arenas the worker dropped: forget them
    keep: bool = True  # the worker reuses its arenas: cache them (else they are used once)


@dataclass(eq=False)
class _Arena:
    id: int
    storage: torch.UntypedStorage
    capacity: int
    used: int = 0
    sent: bool = False


class ArenaAllocator:
    """Worker side: allocates the tensors of one batch at a time from arenas and packs batches for sending.

    `begin()`, tensors from `empty()`, `pack(batch)`, `end(key)`; once the main process has copied the
    batch out, `release(key)` makes its arenas reusable (with `recycle`; otherwise every batch gets fresh
    arenas, which the main process does not keep). Arenas grow to the largest batch seen, so after the first
    batch a batch fits in one arena.
    """

    def __init__(self, worker: int = 0, recycle: bool = True) -> None:
        self.worker, self.recycle = worker, recycle
        self.high_water = 0  # bytes of the largest batch so far
        self.created = 0  # arenas created (a statistic for tests)
        self._free: list[_Arena] = []
        self._leased: dict[Any, list[_Arena]] = {}
        self._batch: list[_Arena] | None = None
        self._batch_bytes = 0
        self._by_ptr: dict[int, _Arena] = {}
        self._retired: list[int] = []

    def begin(self) -> None:
        """Start a batch: tensors from `empty` belong to it until `end`."""
        self._batch, self._batch_bytes = [], 0

    def empty(self, shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
        """An uninitialised CPU tensor in the current batch's arena."""
        if self._batch is None:
            raise RuntimeError("ArenaAllocator.empty outside begin()/end()")
        numel = 1
        for n in shape:
            numel *= int(n)
        nbytes = _aligned(numel * dtype.itemsize)
        arena = self._batch[-1] if self._batch else None
        if arena is None or arena.used + nbytes > arena.capacity:
            arena = self._take(nbytes)
            self._batch.append(arena)
        offset = arena.used
        arena.used += nbytes
        self._batch_bytes += nbytes
        return _view(arena.storage, offset, dtype, tuple(int(n) for n in shape))

    def _take(self, nbytes: int) -> _Arena:
        need = max(nbytes, self.high_water - self._batch_bytes)
        for i, arena in enumerate(self._free):
            if arena.capacity >= need:
                return self._free.pop(i)
        need += need // 4  # headroom: batches (or a batch's parts) vary in size; retire arenas rarely
        capacity = max(_MIN_ARENA, -(-need // _MIN_ARENA) * _MIN_ARENA)
        arena = _Arena(self.created, new_shared_storage(capacity), capacity)
        self.created += 1
        self._by_ptr[arena.storage.data_ptr()] = arena
        return arena

    def pack(self, batch: dict[str, Any]) -> Packed:
        """The current batch for sending: its CPU tensors as arena references (copied into the arena if
        they live elsewhere); other values (CUDA tensors, lists, str) as they are."""
        assert self._batch is not None
        out: dict[str, Any] = {}
        for key, value in batch.items():
            if isinstance(value, torch.Tensor) and value.device.type == "cpu":
                arena = self._by_ptr.get(value.untyped_storage().data_ptr())
                if arena is None or arena not in self._batch:
                    value = self.empty(tuple(value.shape), value.dtype).copy_(value)
                    arena = self._by_ptr[value.untyped_storage().data_ptr()]
                offset = value.storage_offset() * value.element_size()
                out[key] = TensorRef(arena.id, offset, tuple(value.shape), tuple(value.stride()), value.dtype)
            else:
                out[key] = value
        storages = {a.id: a.storage for a in self._batch if not a.sent}
        for arena in self._batch:
            arena.sent = self.recycle
        retired, self._retired = self._retired, []
        return Packed(self.worker, out, storages, retired, keep=self.recycle)

    def end(self, key: Any) -> None:
        """Finish the batch; its arenas stay leased to `key` until `release(key)`."""
        if self._batch is None:
            return
        if self._batch_bytes > self.high_water:
            self.high_water = self._batch_bytes
            for arena in [a for a in self._free if a.capacity < self.high_water]:
                self._free.remove(arena)
                self._retire(arena)
        if self.recycle:
            self._leased[key] = self._batch
        else:  # the main process holds the only reference from now on
            for arena in self._batch:
                del self._by_ptr[arena.storage.data_ptr()]
        self._batch = None

    def release(self, key: Any) -> None:
        """The main process is done with batch `key`: its arenas can hold new batches."""
        for arena in self._leased.pop(key, []):
            if arena.capacity < self.high_water:  # too small for a whole batch now: drop it
                self._retire(arena)
            else:
                arena.used = 0
                self._free.append(arena)

    def _retire(self, arena: _Arena) -> None:
        del self._by_ptr[arena.storage.data_ptr()]
        self._retired.append(arena.id)  # told to the main process with the next batch


class ArenaViews:
    """Main-process side: the arenas received from each worker, and batches rebuilt as views into them.

    `on_keep(storage)` is called for each arena kept, `on_drop(storage)` before one is forgotten (e.g. to
    page-lock arenas for direct copies to the GPU, and unlock them before they are unmapped)."""

    def __init__(self, on_keep: Any = None, on_drop: Any = None) -> None:
        self._arenas: dict[tuple[int, int], torch.UntypedStorage] = {}
        self.on_keep, self.on_drop = on_keep, on_drop

    def __len__(self) -> int:
        return len(self._arenas)

    def _drop(self, key: tuple[int, int]) -> None:
        storage = self._arenas.pop(key, None)
        if storage is not None and self.on_drop is not None:
            self.on_drop(storage)

    def clear(self) -> None:
        """Forget every arena."""
        for key in list(self._arenas):
            self._drop(key)

    def unpack(self, packed: Packed) -> dict[str, Any]:
        """The batch of `packed`; its tensors share memory with the worker's arena (until released)."""
        worker = packed.worker
        for arena in packed.retired:
            self._drop((worker, arena))
        if packed.keep:
            for arena, kept in packed.storages.items():
                self._arenas[(worker, arena)] = kept
                if self.on_keep is not None:
                    self.on_keep(kept)

        def storage(arena: int) -> torch.UntypedStorage:
            found = packed.storages.get(arena)
            return found if found is not None else self._arenas[(worker, arena)]

        return {
            k: _view(storage(v.arena), v.offset, v.dtype, v.shape, v.stride)
            if isinstance(v, TensorRef)
            else v
            for k, v in packed.batch.items()
        }


_ALLOCATOR: ArenaAllocator | None = None  # set in worker processes only


def set_allocator(allocator: ArenaAllocator | None) -> None:
    """Make `shared_empty` allocate from `allocator` in this process."""
    global _ALLOCATOR
    _ALLOCATOR = allocator


def shared_empty(shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
    """An uninitialised CPU tensor in shared memory: in the current batch's arena inside a pipeline worker,
    else a fresh shared storage."""
    if _ALLOCATOR is not None and _ALLOCATOR._batch is not None:
        return _ALLOCATOR.empty(shape, dtype)
    numel = 1
    for n in shape:
        numel *= int(n)
    return _view(new_shared_storage(numel * dtype.itemsize), 0, dtype, tuple(int(n) for n in shape))


def to_shared(tensor: torch.Tensor) -> torch.Tensor:
    """A copy of a CPU tensor in shared memory (see `shared_empty`)."""
    return shared_empty(tuple(tensor.shape), tensor.dtype).copy_(tensor)
