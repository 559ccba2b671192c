"""Level 3 of the pipeline: a copy thread that moves each batch from the host to the device, through
pinned host buffers on a dedicated copy stream, runs the optional `device_transform` there, and hands the
batch over with an event that the consumer's stream waits on (`hand_over`).

On a CPU-only machine (or for device="cpu") this degrades to a pass-through with the same interface, so
the pipeline's logic is the same everywhere.
"""

from __future__ import annotations

import functools
import logging
import queue
import threading
import time
from collections import deque
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from .._seeds import SEED_KEY
from .handoff import Failed, WaitStats, get, one_thread, put

if TYPE_CHECKING:
    from .level1_workers import WorkerPool

log = logging.getLogger(__name__)
Batch = dict[str, Any]
# per-sample seeds stay on the host: they key host-side random draws (e.g. `ImageAugment`'s parameters),
# and reading them back from the device would block the copy thread until its stream is idle
HOST_PATHS = (f"/{SEED_KEY}",)


def to_device(batch: Batch, device: torch.device) -> Batch:
    """Every tensor of `batch` on `device`, except the host-side ones (`HOST_PATHS`)."""
    return map_tensors(batch, lambda path, t: t if path in HOST_PATHS else t.to(device))


def pipeline_device(device: str | torch.device) -> torch.device:
    """PipelineConfig.device as a torch device: "auto" -> the current CUDA device when there is one, else
    CPU; errors name the field."""
    if str(device) == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    device = torch.device(device)
    if device.type == "cuda":
        if not torch.cuda.is_available():
            raise ValueError(
                "PipelineConfig.device is 'cuda' but CUDA is not available (use 'cpu' or 'auto')"
            )
        if device.index is None:
            device = torch.device("cuda", torch.cuda.current_device())
    elif device.type != "cpu":
        raise ValueError(f"PipelineConfig.device must be 'auto', 'cpu' or 'cuda[:i]', got {device}")
    return device


def map_tensors(value: Any, fn: Callable[[str, torch.Tensor], Any], path: str = "") -> Any:
    """Apply fn(path, tensor) to every tensor (numpy arrays are converted) in nested dicts/lists."""
    if isinstance(value, torch.Tensor):
        return fn(path, value)
    if isinstance(value, np.ndarray) and value.dtype != object:
        return fn(path, torch.from_numpy(np.ascontiguousarray(value)))
    if isinstance(value, dict):
        return {k: map_tensors(v, fn, f"{path}/{k}") for k, v in value.items()}
    if isinstance(value, (list, tuple)) and value and isinstance(value[0], (torch.Tensor, np.ndarray, dict)):
        return type(value)(map_tensors(v, fn, f"{path}/{i}") for i, v in enumerate(value))
    return value


class HostToDevice:
    """Copies host batches to the device on a dedicated stream, from pinned memory.

    `copy(batch)` returns (device batch, event); the event marks the end of the copy and of the optional
    device transform, which also runs on the copy stream. Tensors in host memory registered with `pin`
    (the workers' shared-memory arenas) are copied straight from there; others are first staged in a ring
    of pinned buffers. A pinned slot is rewritten only after its previous copy has finished (its event),
    and `copy(release=...)` calls `release` only once the GPU has read the batch's host memory.
    """

    def __init__(self, device: torch.device, slots: int) -> None:
        self.device = device
        self.cuda = device.type == "cuda"
        self._slots: list[dict[str, torch.Tensor]] = [{} for _ in range(slots)]
        self._events: list[Any] = [None] * slots
        self._next = 0
        self.stream = torch.cuda.Stream(device) if self.cuda else None
        self._pinned: dict[int, int] = {}  # registered host memory: start address -> bytes
        self._pending: deque[tuple[Any, Callable[[], None]]] = deque()  # (copy event, release)
        self.pin_failed: str | None = None  # why registering host memory failed (then staging is used)

    def pin(self, storage: torch.UntypedStorage) -> bool:
        """Page-lock `storage` (cudaHostRegister) so copies read it directly; False if not possible."""
        ptr, nbytes = storage.data_ptr(), storage.nbytes()
        if not self.cuda or self.pin_failed or ptr in self._pinned or nbytes == 0:
            return ptr in self._pinned
        cudart = torch.cuda.cudart()
        error = cudart.cudaHostRegister(ptr, nbytes, 0)
        if int(error) != 0:  # e.g. a locked-memory limit: fall back to the staging buffers for good
            self.pin_failed = f"cudaHostRegister of {nbytes} bytes returned {error}"
            log.warning("vla-io: %s; batches are staged through pinned buffers instead", self.pin_failed)
            return False
        self._pinned[ptr] = nbytes
        return True

    def unpin(self, storage: torch.UntypedStorage) -> None:
        """Undo `pin` (before the memory is unmapped); the caller makes sure no copy still reads it."""
        ptr = storage.data_ptr()
        if self._pinned.pop(ptr, None) is not None:
            torch.cuda.cudart().cudaHostUnregister(ptr)

    def _is_pinned(self, tensor: torch.Tensor) -> bool:
        return bool(self._pinned) and tensor.untyped_storage().data_ptr() in self._pinned

    def poll(self, block: bool = False) -> bool:
        """Call the `release` of every copy that has finished (with `block`, wait for all of them); True
        while some copy still has to finish."""
        while self._pending and (block or self._pending[0][0].query()):
            event, release = self._pending.popleft()
            event.synchronize()
            release()
        return bool(self._pending)

    def bind_thread(self) -> None:
        """Call first in the thread that will copy (CUDA's current device is per thread)."""
        if self.cuda:
            torch.cuda.set_device(self.device)

    def copy(
        self,
        batch: Batch,
        device_transform: Callable[[Batch], Batch] | None = None,
        private: bool = False,
        ready: Any = None,
        release: Callable[[], None] | None = None,
    ) -> tuple[Batch, Any]:
        """The batch on the device (and transformed), plus the event to wait for before using it.

        With `private`, the result never shares memory with `batch` (whose shared memory a worker will
        reuse): on CUDA the device copy sees to that, on CPU shared tensors left in the result are cloned.
        `ready` is an event after which CUDA tensors already in `batch` (decoded on the GPU) are complete.
        `release` is called once nothing reads `batch`'s host memory any more: at once after a staged
        copy, later (from `copy` or `poll`) after a direct copy from pinned memory.
        """
        if not self.cuda:
            out = map_tensors(batch, lambda _, t: t)
            out = device_transform(out) if device_transform else out
            if private:
                out = map_tensors(out, lambda _, t: t.clone() if t.is_shared() else t)
            if release is not None:
                release()
            return out, None
        slot = self._next
        self._next = (slot + 1) % len(self._slots)
        if self._events[slot] is not None:
            self._events[slot].synchronize()
        buffers = self._slots[slot]
        direct = []

        def to_device(path: str, tensor: torch.Tensor) -> torch.Tensor:
            if tensor.device.type == "cuda":
                return tensor
            if path in HOST_PATHS:
                return tensor.clone() if private else tensor
            if self._is_pinned(tensor):
                direct.append(path)
                return tensor.to(self.device, non_blocking=True)
            buf = buffers.get(path)
            if buf is None or buf.shape != tensor.shape or buf.dtype != tensor.dtype:
                buf = buffers[path] = torch.empty(tensor.shape, dtype=tensor.dtype, pin_memory=True)
            buf.copy_(tensor)
            return buf.to(self.device, non_blocking=True)

        with torch.cuda.stream(self.stream):
            if ready is not None:
                self.stream.wait_event(ready)
            out = map_tensors(batch, to_device)
            copied = None
            if direct and release is not None:
                copied = torch.cuda.Event(blocking=True)
                copied.record(self.stream)
            if device_transform is not None:
                out = device_transform(out)
            event = torch.cuda.Event(blocking=True)  # waiting on it (slot reuse) sleeps instead of spinning
            event.record(self.stream)
        self._events[slot] = event
        if release is not None:
            if copied is None:
                release()
            else:
                self._pending.append((copied, release))
        self.poll()
        if len(self._pending) > len(self._slots):  # bound how much shared memory waits on the GPU
            self._pending[0][0].synchronize()
            self.poll()
        return out, event


def ready_event(batch: Batch) -> Any:
    """An event recorded on this thread's current stream if `batch` holds CUDA tensors (made by GPU
    decoding or a GPU transform), so the copy stream can wait for exactly that work; None otherwise."""
    found = []
    map_tensors(batch, lambda _, t: found.append(t.is_cuda))
    if not any(found):
        return None
    event = torch.cuda.Event()
    event.record()
    return event


def hand_over(batch: Batch, event: Any, device: torch.device | None = None) -> Batch:
    """Make the consumer's current stream wait for the batch (on the GPU, no host block) and tell the
    caching allocator that the consumer stream uses its memory."""
    if event is None:
        return batch
    stream = torch.cuda.current_stream(device)
    stream.wait_event(event)

    def mark(_: str, tensor: torch.Tensor) -> torch.Tensor:
        if tensor.device.type == "cuda":
            tensor.record_stream(stream)
        return tensor

    return map_tensors(batch, mark)


class DeviceLevel:
    """L3 in its own thread (`thread`, started by the caller): takes L2's batches from `source`, copies
    each to the device with `h2d` (running `device_transform` on the copy stream), hands the workers'
    shared memory back to `pool` once the copy has read it, and puts (tag, device batch, event) into
    `out`. A failure, its own or one from upstream, goes into `out` too, for the consumer to raise."""

    def __init__(
        self,
        h2d: HostToDevice,
        device_transform: Callable | None,
        pool: WorkerPool | None,
        stats: WaitStats,
        *,
        source: queue.Queue,
        out: queue.Queue,
        stop: threading.Event,
    ) -> None:
        self.h2d, self.device_transform, self.pool, self.stats = h2d, device_transform, pool, stats
        self.source, self.out, self.stop = source, out, stop
        self.thread = threading.Thread(target=self._run, name="vla-io-L3", daemon=True)

    def _run(self) -> None:
        """Host batch -> pinned buffer -> copy stream (+ device transform) -> event -> consumer."""
        one_thread()
        try:
            self.h2d.bind_thread()
            while not self.stop.is_set():
                started = time.perf_counter()
                item = get(self.source, self.stop, idle=self.h2d.poll)
                self.stats.add("l2_wait", time.perf_counter() - started)
                if isinstance(item, Failed):
                    put(self.out, item, self.stop)
                    return
                tag, batch, keys, ready = item
                started = time.perf_counter()
                release = (
                    functools.partial(self.pool.release, keys) if keys and self.pool is not None else None
                )
                out, event = self.h2d.copy(
                    batch, self.device_transform, private=bool(keys), ready=ready, release=release
                )
                del batch  # nothing below may touch the workers' shared memory once it is released
                self.stats.add("device", time.perf_counter() - started)
                if not put(self.out, (tag, out, event), self.stop):
                    return
        except InterruptedError:
            return
        except BaseException as err:
            put(self.out, Failed(err), self.stop)
