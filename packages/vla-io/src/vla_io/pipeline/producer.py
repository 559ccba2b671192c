"""`Producer`: the asynchronous levels of a `Pipeline`, running from a start position until closed.

It starts L1 (`level1_workers.WorkerPool`: worker processes), L2 (`level2_host.HostLevel`: the host
thread) and L3 (`level3_device.DeviceLevel`: the copy thread), joined by two bounded queues (L2 -> L3: the
double buffer of transformed batches; L3 -> consumer: batches on the device), and hands out batches in
order with `next()`.
"""

from __future__ import annotations

import queue
import threading
import time
from collections import deque
from collections.abc import Callable
from typing import Any

import torch

from .config import PipelineConfig
from .handoff import POLL_S, Failed, WaitStats
from .level1_workers import WorkerPool
from .level2_host import HostLevel
from .level3_device import DeviceLevel, HostToDevice
from .routing import AffinityRouter, use_affinity
from .sampler import EpochSampler
from .skips import SkipLog


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
        # L1, processes first: forking after our threads exist could copy a held lock into the child
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
        self.host_level = HostLevel(
            dataset, sampler, config, start, pool=self._pool, router=self._router, transform=transform,
            stats=stats, skips=self.skips, out=self._host, stop=self._stop, submitted=self.submitted,
        )  # fmt: skip
        self.device_level = DeviceLevel(
            h2d, device_transform, self._pool, stats, source=self._host, out=self._ready, stop=self._stop
        )
        torch.get_num_threads()  # fixes this thread's intra-op thread count before ours set theirs to 1
        self._threads = [self.host_level.thread, self.device_level.thread]
        for thread in self._threads:
            thread.start()

    def next(self, stats: WaitStats) -> tuple[tuple[int, int], Any, Any]:
        """The next (tag, batch, event); raises what failed upstream."""
        started = time.perf_counter()
        while True:
            try:
                item = self._ready.get(timeout=POLL_S)
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
        if isinstance(item, Failed):
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
