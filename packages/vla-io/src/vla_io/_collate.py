"""Collation of sample dicts into batch dicts, for datasets that only offer `__getitem__`."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import torch


def collate(samples: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """Stack tensors and arrays along a new batch axis; other values become lists."""
    if not samples:
        raise ValueError("cannot collate an empty list of samples")
    out: dict[str, Any] = {}
    for key in samples[0]:
        values = [s[key] for s in samples]
        first = values[0]
        if isinstance(first, torch.Tensor):
            out[key] = torch.stack(values)
        elif isinstance(first, np.ndarray) and first.dtype != object:
            out[key] = torch.from_numpy(np.stack(values))
        elif isinstance(first, (bool, int, float, np.number, np.bool_)):
            out[key] = torch.as_tensor(np.asarray(values))
        else:
            out[key] = list(values)
    return out


class SharedPool:
    """Shared-memory storages a worker process reuses once the main process has copied a batch out.

    Fresh shared memory costs a page fault (and zeroing) per 4 KB on first touch; reusing it makes the
    frame copy a plain memcpy. Storages allocated between `begin()` and `end(key)` are leased to `key`
    until `release(key)`.
    """

    def __init__(self, keep: int = 64) -> None:
        self.keep = keep
        self._free: dict[int, list[torch.UntypedStorage]] = {}
        self._leased: dict[object, list[torch.UntypedStorage]] = {}
        self._current: list[torch.UntypedStorage] | None = None

    def begin(self) -> None:
        self._current = []

    def end(self, key: object) -> None:
        self._leased[key] = self._current or []
        self._current = None

    def release(self, key: object) -> None:
        for storage in self._leased.pop(key, []):
            free = self._free.setdefault(storage.nbytes(), [])
            if len(free) < self.keep:
                free.append(storage)

    def storage(self, nbytes: int) -> torch.UntypedStorage:
        free = self._free.get(nbytes)
        storage = free.pop() if free else _new_shared(nbytes)
        if self._current is not None:
            self._current.append(storage)
        return storage


_POOL: SharedPool | None = None  # set in worker processes only


def set_shared_pool(pool: SharedPool | None) -> None:
    """Make `shared_empty` draw from `pool` in this process."""
    global _POOL
    _POOL = pool


def _new_shared(nbytes: int) -> torch.UntypedStorage:
    try:  # the allocator torch's own default_collate uses in workers
        return torch.UntypedStorage._new_shared(nbytes)
    except (AttributeError, RuntimeError):
        return torch.empty(nbytes, dtype=torch.uint8).share_memory_().untyped_storage()


def shared_empty(shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
    """An uninitialised CPU tensor in shared memory (no copy, unlike share_memory_()); reused storage
    when this process has a `SharedPool`."""
    numel = 1
    for n in shape:
        numel *= int(n)
    nbytes = numel * dtype.itemsize
    storage = _POOL.storage(nbytes) if _POOL is not None else _new_shared(nbytes)
    return torch.empty(0, dtype=dtype).set_(storage, 0, shape)


def share(batch: Mapping[str, Any]) -> dict[str, Any]:
    """The batch with its CPU tensors moved into shared memory (no-op for tensors already there)."""
    return {
        k: (v.share_memory_() if isinstance(v, torch.Tensor) and v.device.type == "cpu" else v)
        for k, v in batch.items()
    }
