"""Level 1 of the pipeline: worker processes that load (decode + collate) batches into shared memory.

`load_batch` is the unit of work: a batch of samples from the dataset plus each sample's seed. Workers run
it into their shared-memory arenas (`shm`) and send back a few offsets; with `num_workers=0` the L2 host
thread runs it itself, and `synchronous=True` runs it in the caller's thread. `routing` says which worker
loads which samples.
"""

from __future__ import annotations

import contextlib
import functools
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

from .._errors import SAMPLE_ERRORS, WorkerError, WorkerTimeoutError
from .._seeds import SEED_KEY
from .collation import collate
from .sampler import BatchTask
from .shm import ArenaAllocator, ArenaViews, Packed, set_allocator
from .skips import SKIP_KEY, load_skipping

log = logging.getLogger(__name__)
_POLL_S = 0.1


@functools.lru_cache(maxsize=16)
def _parameters(function: Any) -> frozenset[str]:
    return frozenset(inspect.signature(function).parameters)


def load_batch(
    dataset: Any, task: BatchTask, image_dtype: str | None, shared: bool, skip_bad: bool = False
) -> dict[str, Any]:
    """The collated batch of a task (or part of one), plus each sample's seed under SEED_KEY
    ("sample_seed").

    `shared`: ask the dataset for shared-memory tensors (in a worker: the batch's arena). `skip_bad`:
    replace samples that cannot be decoded (notes under SKIP_KEY, see `skips`) instead of raising."""
    if not skip_bad:
        batch = _load_rows(dataset, task.indices, image_dtype, shared)
    else:
        try:
            batch = _load_rows(dataset, task.indices, image_dtype, shared)
            batch[SKIP_KEY] = [None] * len(task.indices)
        except SAMPLE_ERRORS:
            batch = load_skipping(
                dataset, task.indices, lambda rows: _load_rows(dataset, rows, image_dtype, False)
            )
    batch[SEED_KEY] = torch.from_numpy(task.seeds.copy())
    return batch


def _load_rows(dataset: Any, indices: np.ndarray, image_dtype: str | None, shared: bool) -> dict[str, Any]:
    get_batch = getattr(dataset, "get_batch", None)
    if get_batch is not None:
        params = _parameters(getattr(get_batch, "__func__", get_batch))
        kwargs: dict[str, Any] = {}
        if "image_dtype" in params and image_dtype is not None:
            kwargs["image_dtype"] = image_dtype
        if "shared_memory" in params:
            kwargs["shared_memory"] = shared
        return dict(get_batch(indices, **kwargs))
    return collate([dataset[int(i)] for i in indices])


Key = tuple[tuple[int, int], int]  # ((epoch, batch), part)


@dataclass(frozen=True)
class PartTask:
    """The samples of one batch that one worker loads."""

    tag: tuple[int, int]
    part: int
    task: BatchTask

    @property
    def key(self) -> Key:
        return (self.tag, self.part)


@dataclass(frozen=True)
class Release:
    """Tells a worker that the main process has copied part `key` out: its shared memory is free again."""

    key: Key


@dataclass
class _Failure:
    """What a worker sends back instead of a batch when loading raised."""

    worker: int
    pid: int
    tag: tuple[int, int]
    text: str


def _worker_loop(
    worker: int, dataset: Any, tasks: Any, results: Any, image_dtype: str | None, seed: int, recycle: bool,
    skip_bad: bool = False,
) -> None:  # fmt: skip
    # Ctrl-C and a scheduler's SIGTERM (sent to the whole process group) are the main process's business:
    # it may save a checkpoint first, then closes the workers. Orphaned workers still leave (getppid below).
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    torch.set_num_threads(1)
    np.random.seed((seed + worker) & 0xFFFFFFFF)
    torch.manual_seed(seed + worker)
    parent = os.getppid()
    arenas = ArenaAllocator(worker, recycle)  # reused only if the main process releases batches
    set_allocator(arenas)
    while True:
        try:
            task = tasks.get(timeout=1.0)
        except queue.Empty:
            if os.getppid() != parent:  # the main process is gone: do not linger
                return
            continue
        if task is None:
            return
        if isinstance(task, Release):
            arenas.release(task.key)
            continue
        arenas.begin()
        try:
            message: Any = arenas.pack(load_batch(dataset, task.task, image_dtype, True, skip_bad))
        except Exception:
            message = _Failure(worker, os.getpid(), task.tag, traceback.format_exc())
        arenas.end(task.key)
        results.put((task.key, message))


class WorkerPool:
    """Persistent worker processes; each part task goes to a chosen worker, results are collected by key."""

    def __init__(
        self, dataset: Any, num_workers: int, start_method: str, image_dtype: str | None, seed: int,
        timeout_s: float, recycle: bool = False, skip_bad: bool = False,
    ) -> None:  # fmt: skip
        ctx = mp.get_context(start_method)
        self._results = ctx.Queue()
        self._tasks = [ctx.Queue() for _ in range(num_workers)]
        self._procs = [
            ctx.Process(
                target=_worker_loop,
                args=(i, dataset, self._tasks[i], self._results, image_dtype, seed, recycle, skip_bad),
                daemon=True,
                name=f"vla-io-worker-{i}",
            )  # fmt: skip
            for i in range(num_workers)
        ]
        for proc in self._procs:
            proc.start()
        self._ready: dict[Key, Any] = {}
        self._owner: dict[Key, int] = {}
        self._worker_of: dict[Key, int] = {}  # parts delivered but not yet released
        self._views = ArenaViews()  # the workers' arenas, received once each
        self.timeout_s = timeout_s
        self.recycle = recycle

    def __len__(self) -> int:
        return len(self._procs)

    def submit(self, task: PartTask, worker: int) -> None:
        """Queue a part task on `worker`."""
        self._owner[task.key] = worker
        self._worker_of[task.key] = worker
        self._tasks[worker].put(task)

    def get(self, key: Key, stop: Any = None) -> dict[str, Any]:
        """The loaded part `key`, waiting for it; raises WorkerError if its worker failed or died."""
        start = time.monotonic()
        tag = key[0]
        while key not in self._ready:
            try:
                got, value = self._results.get(timeout=_POLL_S)
                self._ready[got] = value
            except queue.Empty:
                self._check_alive(tag)
                if stop is not None and stop.is_set():
                    raise InterruptedError("pipeline stopped") from None
                if time.monotonic() - start > self.timeout_s:
                    worker = self._owner.get(key)
                    pid = self._procs[worker].pid if worker is not None else "?"
                    if worker is not None:  # stuck (in native code, or stopped): it would not exit politely
                        self._procs[worker].kill()
                    raise WorkerTimeoutError(
                        f"worker {worker} (pid {pid}, alive, now stopped) had not delivered batch {tag} "
                        f"(epoch, batch) for {time.monotonic() - start:.0f} s",
                        self.timeout_s,
                    ) from None
        value = self._ready.pop(key)
        self._owner.pop(key, None)
        if isinstance(value, _Failure):
            raise WorkerError(
                f"worker {value.worker} (pid {value.pid}) failed on batch {value.tag} (epoch, batch):\n{value.text}"
            )
        return self._views.unpack(value) if isinstance(value, Packed) else value

    def watch_arenas(self, on_keep: Any, on_drop: Any) -> None:
        """Call on_keep(storage) for each worker arena the main process keeps, on_drop(storage) before
        it lets one go (retired by its worker, or at close)."""
        self._views.on_keep, self._views.on_drop = on_keep, on_drop

    def release(self, keys: list[Key]) -> None:
        """Let the workers reuse the shared memory of these parts (the caller copied them out)."""
        for key in keys:
            worker = self._worker_of.pop(key, None)
            if worker is not None and self.recycle:
                self._tasks[worker].put(Release(key))

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
        self._views.clear()
        for q in [*self._tasks, self._results]:
            q.cancel_join_thread()
            q.close()
