"""The asynchronous part of `Pipeline`: worker pool (L1), host thread (L2) and copy thread (L3)."""

from __future__ import annotations

import functools
import logging
import queue
import threading
import time
from collections import deque
from collections.abc import Callable
from typing import Any

import torch

from ._device import HostToDevice, ready_event
from ._pipeline_config import PipelineConfig
from ._sampler import EpochSampler
from ._skips import SkipLog
from ._workers import (
    AffinityRouter,
    PartTask,
    WorkerPool,
    assemble,
    load_batch,
    plan_parts,
    use_affinity,
)

log = logging.getLogger(__name__)
_POLL_S = 0.1
_IDLE_POLL_S = 0.005  # while copies are in flight, the idle copy thread hands their memory back this soon


class WaitStats:
    """Thread-safe totals of waiting and busy seconds per pipeline level."""

    NAMES = ("l1_wait", "l2_wait", "l3_wait", "transform", "device")

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.reset()

    def reset(self) -> None:
        """Zero everything."""
        with self._lock:
            self._totals = dict.fromkeys(self.NAMES, 0.0)
            self.batches = 0

    def add(self, name: str, seconds: float) -> None:
        """Add seconds to one total."""
        with self._lock:
            self._totals[name] += seconds

    def summary(self) -> dict[str, float]:
        """Totals in seconds (`<name>_s`) and per delivered batch in milliseconds (`<name>_ms`)."""
        with self._lock:
            out: dict[str, float] = {"batches": float(self.batches)}
            for name, total in self._totals.items():
                out[f"{name}_s"] = total
                out[f"{name}_ms"] = 1000.0 * total / max(self.batches, 1)
            return out


class _Failed:
    """An exception travelling downstream to the consumer."""

    def __init__(self, error: BaseException) -> None:
        self.error = error


def _put(q: queue.Queue, item: Any, stop: threading.Event) -> bool:
    while not stop.is_set():
        try:
            q.put(item, timeout=_POLL_S)
            return True
        except queue.Full:
            continue
    return False


def _get(q: queue.Queue, stop: threading.Event, idle: Callable[[], bool] | None = None) -> Any:
    """The next item; while waiting, `idle()` runs between polls (it returns True to be called again soon)."""
    while not stop.is_set():
        soon = idle() if idle is not None else False
        try:
            return q.get(timeout=_IDLE_POLL_S if soon else _POLL_S)
        except queue.Empty:
            continue
    raise InterruptedError("pipeline stopped")


def _one_thread() -> None:
    """One intra-op thread for torch work in this thread (copies, the transforms): a copy split over every
    core wakes an OpenMP team that then spins, taking cores from the decoding workers. Like torch's own
    pin-memory thread; threads started later inherit the setting, the caller's thread keeps its own."""
    torch.set_num_threads(1)


class Producer:
    """Runs L1-L3 from a start position until closed; `next()` hands out batches in order."""

    def __init__(
        self,
        dataset: Any,
        sampler: EpochSampler,
        config: PipelineConfig,
        start: tuple[int, int],
        *,
        transform: Callable | None,
        device_transform: Callable | None,
        h2d: HostToDevice,
        stats: WaitStats,
        skips: SkipLog | None = None,
    ) -> None:
        self.dataset, self.sampler, self.config = dataset, sampler, config
        self.skips = skips if skips is not None else SkipLog()
        self.transform, self.device_transform, self.h2d, self.stats = transform, device_transform, h2d, stats
        self.start = start
        self.submitted: deque[tuple[int, int]] = deque(
            maxlen=4096
        )  # tags in submission order (tests, debugging)
        self._stop = threading.Event()
        self._host: queue.Queue = queue.Queue(maxsize=config.host_buffers)
        self._ready: queue.Queue = queue.Queue(maxsize=config.device_buffers)
        # processes first: forking after our threads exist could copy a held lock into the child
        recycle = config.reuse_shared_memory
        self._pool = None
        if config.num_workers > 0:
            self._pool = WorkerPool(
                dataset, config.num_workers, config.start_method, config.image_dtype, config.seed,
                config.timeout_s, recycle, config.skip_bad_samples,
            )  # fmt: skip
        if self._pool is not None and recycle and config.pin_shared_memory and h2d.cuda:
            self._pool.watch_arenas(h2d.pin, h2d.unpin)
        self.routed_by_affinity = self._pool is not None and use_affinity(dataset, config.affinity)
        self._router = AffinityRouter(dataset, config.num_workers) if self.routed_by_affinity else None
        torch.get_num_threads()  # fixes this thread's intra-op thread count before ours set theirs to 1
        self._threads = [
            threading.Thread(target=self._host_loop, name="vla-io-L2", daemon=True),
            threading.Thread(target=self._copy_loop, name="vla-io-L3", daemon=True),
        ]
        for thread in self._threads:
            thread.start()

    def _host_loop(self) -> None:
        """L2: submit tasks ahead, collect batches in order, run the transform, fill the double buffer."""
        _one_thread()
        try:
            tasks = self.sampler.tasks(*self.start)
            inflight: deque = deque()
            ahead = max(2, self.config.num_workers * self.config.prefetch_per_worker)
            turn = 0
            router = self._router
            while not self._stop.is_set():
                while self._pool is not None and len(inflight) < ahead:
                    task = next(tasks)
                    plan = plan_parts(task, len(self._pool), router, turn)
                    turn += 1
                    for part, (worker, positions) in enumerate(plan):
                        sub = task.subset(positions) if len(plan) > 1 else task
                        self._pool.submit(PartTask(task.tag, part, sub), worker)
                    self.submitted.append(task.tag)
                    inflight.append((task, plan))
                if self._pool is not None:
                    task, plan = inflight.popleft()
                    started = time.perf_counter()
                    keys = [(task.tag, part) for part in range(len(plan))]
                    parts = [self._pool.get(key, self._stop) for key in keys]
                    batch = assemble(parts, [positions for _, positions in plan])
                    if len(parts) > 1 or not self._pool.recycle:
                        self._pool.release(keys)  # assembled copies (or nothing to recycle): free now
                        keys = []
                else:
                    task = next(tasks)
                    self.submitted.append(task.tag)
                    started = time.perf_counter()
                    batch = load_batch(
                        self.dataset, task, self.config.image_dtype, False, self.config.skip_bad_samples
                    )
                    keys = []
                self.skips.take(batch, task.tag)  # skip notes never reach the transform
                self.stats.add("l1_wait", time.perf_counter() - started)
                if self.transform is not None:
                    started = time.perf_counter()
                    batch = dict(self.transform(batch))
                    self.stats.add("transform", time.perf_counter() - started)
                if not _put(self._host, (task.tag, batch, keys, ready_event(batch)), self._stop):
                    return
        except InterruptedError:
            return
        except BaseException as err:  # everything reaches the consumer, nothing dies silently
            _put(self._host, _Failed(err), self._stop)

    def _copy_loop(self) -> None:
        """L3: host batch -> pinned buffer -> copy stream (+ device transform) -> event -> consumer."""
        _one_thread()
        try:
            self.h2d.bind_thread()
            while not self._stop.is_set():
                started = time.perf_counter()
                item = _get(self._host, self._stop, idle=self.h2d.poll)
                self.stats.add("l2_wait", time.perf_counter() - started)
                if isinstance(item, _Failed):
                    _put(self._ready, item, self._stop)
                    return
                tag, batch, keys, ready = item
                started = time.perf_counter()
                release = (
                    functools.partial(self._pool.release, keys) if keys and self._pool is not None else None
                )
                out, event = self.h2d.copy(
                    batch, self.device_transform, private=bool(keys), ready=ready, release=release
                )
                del batch  # nothing below may touch the workers' shared memory once it is released
                self.stats.add("device", time.perf_counter() - started)
                if not _put(self._ready, (tag, out, event), self._stop):
                    return
        except InterruptedError:
            return
        except BaseException as err:
            _put(self._ready, _Failed(err), self._stop)

    def next(self, stats: WaitStats) -> tuple[tuple[int, int], Any, Any]:
        """The next (tag, batch, event); raises what failed upstream."""
        started = time.perf_counter()
        while True:
            try:
                item = self._ready.get(timeout=_POLL_S)
                break
            except queue.Empty:
                if all(t.is_alive() for t in self._threads):
                    continue
                # The host thread ends after handing its failure to the copy thread, which forwards it: wait
                # for that before concluding nothing was delivered (under load this once lost the error).
                for thread in self._threads:
                    thread.join(timeout=2.0)
                if self._ready.empty():
                    raise RuntimeError("vla-io pipeline threads stopped without delivering a batch") from None
        stats.add("l3_wait", time.perf_counter() - started)
        if isinstance(item, _Failed):
            self.close()
            raise item.error
        return item

    def close(self) -> None:
        """Stop both threads and the workers; safe to call twice."""
        self._stop.set()
        for q in (self._host, self._ready):
            while True:
                try:
                    q.get_nowait()
                except queue.Empty:
                    break
        for thread in self._threads:
            if thread is not threading.current_thread():
                thread.join(timeout=10.0)
        if self.h2d.stream is not None:  # no copy may still read the arenas when they are unpinned
            self.h2d.stream.synchronize()
        self.h2d.poll(block=True)
        if self._pool is not None:
            self._pool.close()
            self._pool = None
