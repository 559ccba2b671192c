"""Level 2 of the pipeline: a host thread that keeps the L1 workers busy, collects their batches in order
and runs the caller's `transform` (e.g. a model processor) on each, filling a double buffer for level 3."""

from __future__ import annotations

import queue
import threading
import time
from collections import deque
from collections.abc import Callable
from typing import Any

from .config import PipelineConfig
from .handoff import Failed, WaitStats, one_thread, put
from .level1_workers import PartTask, WorkerPool, load_batch
from .level3_device import ready_event
from .routing import AffinityRouter, assemble, plan_parts
from .sampler import EpochSampler
from .skips import SkipLog


class HostLevel:
    """L2 in its own thread (`thread`, started by the caller): submits tasks from a start position ahead
    to the workers (`pool`; None loads in this thread), collects the batches in order and puts
    (tag, transformed batch, keys of the workers' shared memory it still uses, ready event) into `out`.
    A failure goes into `out` too, for the consumer to raise."""

    def __init__(
        self,
        dataset: Any,
        sampler: EpochSampler,
        config: PipelineConfig,
        start: tuple[int, int],
        *,
        pool: WorkerPool | None,
        router: AffinityRouter | None,
        transform: Callable | None,
        stats: WaitStats,
        skips: SkipLog,
        out: queue.Queue,
        stop: threading.Event,
        submitted: deque[tuple[int, int]],
    ) -> None:
        self.dataset, self.sampler, self.config, self.start = dataset, sampler, config, start
        self.pool, self.router, self.transform = pool, router, transform
        self.stats, self.skips, self.out, self.stop = stats, skips, out, stop
        self.submitted = submitted  # tags in submission order (tests, debugging)
        self.thread = threading.Thread(target=self._run, name="vla-io-L2", daemon=True)

    def _run(self) -> None:
        """Submit tasks ahead, collect batches in order, run the transform, fill the double buffer."""
        one_thread()
        try:
            tasks = self.sampler.tasks(*self.start)
            inflight: deque = deque()
            ahead = max(2, self.config.num_workers * self.config.prefetch_per_worker)
            turn = 0
            while not self.stop.is_set():
                while self.pool is not None and len(inflight) < ahead:
                    task = next(tasks)
                    plan = plan_parts(task, len(self.pool), self.router, turn)
                    turn += 1
                    for part, (worker, positions) in enumerate(plan):
                        sub = task.subset(positions) if len(plan) > 1 else task
                        self.pool.submit(PartTask(task.tag, part, sub), worker)
                    self.submitted.append(task.tag)
                    inflight.append((task, plan))
                if self.pool is not None:
                    task, plan = inflight.popleft()
                    started = time.perf_counter()
                    keys = [(task.tag, part) for part in range(len(plan))]
                    parts = [self.pool.get(key, self.stop) for key in keys]
                    batch = assemble(parts, [positions for _, positions in plan])
                    if len(parts) > 1 or not self.pool.recycle:
                        self.pool.release(keys)  # assembled copies (or nothing to recycle): free now
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
                if not put(self.out, (task.tag, batch, keys, ready_event(batch)), self.stop):
                    return
        except InterruptedError:
            return
        except BaseException as err:  # everything reaches the consumer, nothing dies silently
            put(self.out, Failed(err), self.stop)
