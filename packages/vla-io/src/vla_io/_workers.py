"""Level 1 of the pipeline: worker processes that load (decode + collate) batches into shared memory."""

from __future__ import annotations

import contextlib
import inspect
import logging
import os
import queue
import signal
import time
import traceback
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
import torch.multiprocessing as mp

from ._collate import collate, share
from ._errors import WorkerError
from ._sampler import BatchTask

log = logging.getLogger(__name__)
SEED_KEY = "sample_seed"
_POLL_S = 0.1


def load_batch(dataset: Any, task: BatchTask, image_dtype: str | None, shared: bool) -> dict[str, Any]:
    """The collated batch of a task, plus each sample's seed under "sample_seed"."""
    get_batch = getattr(dataset, "get_batch", None)
    if get_batch is not None:
        params = inspect.signature(get_batch).parameters
        kwargs: dict[str, Any] = {}
        if "image_dtype" in params and image_dtype is not None:
            kwargs["image_dtype"] = image_dtype
        if "shared_memory" in params:
            kwargs["shared_memory"] = shared
        batch = dict(get_batch(task.indices, **kwargs))
    else:
        batch = collate([dataset[int(i)] for i in task.indices])
    batch[SEED_KEY] = torch.from_numpy(task.seeds.copy())
    return share(batch) if shared else batch


@dataclass
class _Failure:
    """What a worker sends back instead of a batch when loading raised."""

    worker: int
    pid: int
    tag: tuple[int, int]
    text: str


def _worker_loop(
    worker: int, dataset: Any, tasks: Any, results: Any, image_dtype: str | None, seed: int
) -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the main process's business
    torch.set_num_threads(1)
    np.random.seed((seed + worker) & 0xFFFFFFFF)
    torch.manual_seed(seed + worker)
    parent = os.getppid()
    while True:
        try:
            task = tasks.get(timeout=1.0)
        except queue.Empty:
            if os.getppid() != parent:  # the main process is gone: do not linger
                return
            continue
        if task is None:
            return
        try:
            results.put((task.tag, load_batch(dataset, task, image_dtype, shared=True)))
        except Exception:
            results.put((task.tag, _Failure(worker, os.getpid(), task.tag, traceback.format_exc())))


class WorkerPool:
    """Persistent worker processes; tasks go round-robin, results are collected by tag in any order."""

    def __init__(
        self, dataset: Any, num_workers: int, start_method: str, image_dtype: str | None, seed: int,
        timeout_s: float,
    ) -> None:  # fmt: skip
        ctx = mp.get_context(start_method)
        self._results = ctx.Queue()
        self._tasks = [ctx.Queue() for _ in range(num_workers)]
        self._procs = [
            ctx.Process(
                target=_worker_loop,
                args=(i, dataset, self._tasks[i], self._results, image_dtype, seed),
                daemon=True,
                name=f"vla-io-worker-{i}",
            )  # fmt: skip
            for i in range(num_workers)
        ]
        for proc in self._procs:
            proc.start()
        self._ready: dict[tuple[int, int], Any] = {}
        self._owner: dict[tuple[int, int], int] = {}
        self._next = 0
        self.timeout_s = timeout_s

    def submit(self, task: BatchTask) -> None:
        """Queue a task on the next worker."""
        worker = self._next % len(self._procs)
        self._next += 1
        self._owner[task.tag] = worker
        self._tasks[worker].put(task)

    def get(self, tag: tuple[int, int], stop: Any = None) -> dict[str, Any]:
        """The batch of `tag`, waiting for it; raises WorkerError if its worker failed or died."""
        start = time.monotonic()
        while tag not in self._ready:
            try:
                got_tag, value = self._results.get(timeout=_POLL_S)
                self._ready[got_tag] = value
            except queue.Empty:
                self._check_alive(tag)
                if stop is not None and stop.is_set():
                    raise InterruptedError("pipeline stopped") from None
                if time.monotonic() - start > self.timeout_s:
                    raise WorkerError(
                        f"batch {tag} (epoch, batch) not loaded after {self.timeout_s:.0f} s by worker "
                        f"{self._owner.get(tag)}; raise PipelineConfig.timeout_s if loading is just slow"
                    ) from None
        value = self._ready.pop(tag)
        self._owner.pop(tag, None)
        if isinstance(value, _Failure):
            raise WorkerError(
                f"worker {value.worker} (pid {value.pid}) failed on batch {value.tag} (epoch, batch):\n{value.text}"
            )
        return value

    def _check_alive(self, tag: tuple[int, int]) -> None:
        for i, proc in enumerate(self._procs):
            if not proc.is_alive():
                code = proc.exitcode
                how = f"killed by signal {-code}" if code is not None and code < 0 else f"exit code {code}"
                raise WorkerError(
                    f"worker {i} (pid {proc.pid}) died ({how}) while batch {tag} was pending; "
                    "a crash in native code (decoder) or the out-of-memory killer are likely causes"
                )

    def close(self) -> None:
        """Stop the workers (politely, then by force) and release the queues."""
        for q in self._tasks:
            with contextlib.suppress(OSError, ValueError):
                q.put(None)
        deadline = time.monotonic() + 5.0
        for proc in self._procs:
            proc.join(timeout=max(0.0, deadline - time.monotonic()))
            if proc.is_alive():
                proc.terminate()
                proc.join(timeout=2.0)
            if proc.is_alive():
                proc.kill()
                proc.join(timeout=1.0)
        self._ready.clear()
        for q in [*self._tasks, self._results]:
            q.cancel_join_thread()
            q.close()
