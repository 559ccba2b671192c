"""One set of gloo worker processes for the whole test session (starting a group costs seconds here).

Four processes join one default group; sub-groups of the first k ranks (k = 1..4) give every world size,
each also as a deferred (fake) group. `pool.run(name, world_size, **kwargs)` calls
`_overlap_workers.<name>(ctx, **kwargs)` on ranks < world_size and returns their results in rank order.
"""

from __future__ import annotations

import faulthandler
import io
import multiprocessing as mp
import os
import queue
import signal
import tempfile
import time
import traceback
from datetime import timedelta
from typing import Any

import torch

MAX_WORLD = 4
RESULT_TIMEOUT_S = 150
COLLECTIVE_TIMEOUT = timedelta(seconds=60)  # a hung collective errors out before the pool gives up


class Ctx:
    """What a worker function gets: its rank and the process groups of one world size."""

    def __init__(self, rank: int, world_size: int, group: Any, deferred: Any) -> None:
        self.rank, self.world_size, self.group, self.deferred = rank, world_size, group, deferred


def _dumps(value: Any) -> bytes:
    buffer = io.BytesIO()
    torch.save(value, buffer)
    return buffer.getvalue()


def _worker(rank: int, store_path: str, tasks: Any, results: Any) -> None:
    import _overlap_deferred_pg
    import torch.distributed as dist

    torch.set_num_threads(1)
    faulthandler.register(signal.SIGUSR1, all_threads=True)  # the parent asks for stacks when we hang
    _overlap_deferred_pg.register()
    dist.init_process_group(
        "gloo",
        init_method=f"file://{store_path}",
        rank=rank,
        world_size=MAX_WORLD,
        timeout=timedelta(seconds=90),
    )
    groups, deferred = {}, {}
    for size in range(1, MAX_WORLD + 1):  # every rank takes part in every new_group call
        ranks = list(range(size))
        groups[size] = (
            dist.new_group(ranks, timeout=COLLECTIVE_TIMEOUT) if size < MAX_WORLD else dist.group.WORLD
        )
        deferred[size] = dist.new_group(ranks, backend="deferred", timeout=COLLECTIVE_TIMEOUT)
    import _overlap_workers

    while True:
        task = tasks.get()
        if task is None:
            break
        name, world_size, kwargs = task
        try:
            value = None
            if rank < world_size:
                ctx = Ctx(rank, world_size, groups[world_size], deferred[world_size])
                value = getattr(_overlap_workers, name)(ctx, **kwargs)
            results.put((rank, True, _dumps(value)))
        except BaseException:  # report everything, keep serving
            results.put((rank, False, traceback.format_exc()))
    dist.destroy_process_group()


class WorkerPool:
    def __init__(self) -> None:
        self._start()

    def _start(self) -> None:
        ctx = mp.get_context("spawn")
        self._dir = tempfile.TemporaryDirectory(prefix="vla-overlap-pool-")
        store = os.path.join(self._dir.name, "store")
        self._tasks = [ctx.Queue() for _ in range(MAX_WORLD)]
        self._results = ctx.Queue()
        self._procs = [
            ctx.Process(target=_worker, args=(r, store, self._tasks[r], self._results), daemon=True)
            for r in range(MAX_WORLD)
        ]
        for proc in self._procs:
            proc.start()

    def run(self, name: str, world_size: int, **kwargs: Any) -> list[Any]:
        for tasks in self._tasks:
            tasks.put((name, world_size, kwargs))
        got: dict[int, Any] = {}
        errors = []
        for _ in range(MAX_WORLD):
            try:
                rank, ok, payload = self._results.get(timeout=RESULT_TIMEOUT_S)
            except queue.Empty:
                # Dump every worker's stack (faulthandler, to stderr) for the report, then start a fresh
                # pool so that one hung collective fails one test instead of every test after it.
                for proc in self._procs:
                    if proc.is_alive() and proc.pid is not None:
                        os.kill(proc.pid, signal.SIGUSR1)
                time.sleep(2)
                self._restart()
                raise TimeoutError(
                    f"{name} at world size {world_size}: no answer in {RESULT_TIMEOUT_S} s (worker stacks "
                    "were written to stderr; the pool was restarted)"
                ) from None
            if ok:
                got[rank] = torch.load(io.BytesIO(payload), weights_only=False)
            else:
                errors.append(f"--- rank {rank}\n{payload}")
        if errors:
            raise WorkerError(f"{name} at world size {world_size} failed:\n" + "\n".join(errors))
        return [got[r] for r in range(world_size)]

    def _restart(self) -> None:
        for proc in self._procs:
            proc.kill()
            proc.join()
        self._dir.cleanup()
        self._start()

    def close(self) -> None:
        for tasks in self._tasks:
            tasks.put(None)
        for proc in self._procs:
            proc.join(timeout=30)
            if proc.is_alive():
                proc.kill()
        self._dir.cleanup()


class WorkerError(AssertionError):
    """A worker raised; the message carries every failing rank's traceback."""
