"""One set of gloo worker processes for the whole test session (starting a group costs seconds here).

Four processes join one default group; sub-groups of the first k ranks (k = 1..4) give every world size,
each also as a deferred (fake) group. `pool.run(name, world_size, **kwargs)` calls the worker function
`name(ctx, **kwargs)` on ranks < world_size and returns their results in rank order. The worker functions
live in the topic modules of WORKER_MODULES (shared helpers in _workers_common); a name is looked up in all.

A hang must fail one test, not stall the run: every task has one deadline for all its answers; past it, the
pool dumps the workers' stacks (faulthandler, to stderr), starts fresh processes for the next task and raises.
Answers carry their task's number, so a late answer never reaches another task. (The hangs that taught us
this came from real-time scheduling that SVT-AV1 had left on pytest's thread, inherited by these workers;
vla-io's VideoWriter now undoes it.)
"""

from __future__ import annotations

import faulthandler
import importlib
import inspect
import io
import itertools
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
TASK_TIMEOUT_S = 120  # every task takes seconds; the slowest about 20 s on 2 busy cores
COLLECTIVE_TIMEOUT = timedelta(seconds=60)  # a hung collective errors out before the pool gives up
WORKER_MODULES = (
    "_workers_equivalence",
    "_workers_deferred",
    "_workers_zero1",
    "_workers_buffers",
    "_workers_errors",
    "_workers_edge_cases",
    "_workers_in_place",
    "_workers_state",
    "_workers_moments8",
)


def worker_functions() -> dict[str, Any]:
    """name -> public function defined in one of WORKER_MODULES. A name defined in two modules is an error
    rather than a silent pick of one."""
    found: dict[str, Any] = {}
    for module_name in WORKER_MODULES:
        module = importlib.import_module(module_name)
        for name, value in vars(module).items():
            if name.startswith("_") or not inspect.isfunction(value) or value.__module__ != module_name:
                continue  # private helpers and what the module imported
            if name in found:
                raise RuntimeError(
                    f"worker {name!r} is defined in {found[name].__module__} and {module_name}"
                )
            found[name] = value
    return found


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
    workers = worker_functions()

    while True:
        task = tasks.get()
        if task is None:
            break
        number, name, world_size, kwargs = task
        try:
            value = None
            if rank < world_size:
                ctx = Ctx(rank, world_size, groups[world_size], deferred[world_size])
                if name not in workers:
                    raise LookupError(f"no worker function {name!r} in {', '.join(WORKER_MODULES)}")
                value = workers[name](ctx, **kwargs)
            results.put((number, rank, True, _dumps(value)))
        except BaseException:  # report everything, keep serving
            results.put((number, rank, False, traceback.format_exc()))
    dist.destroy_process_group()


class WorkerPool:
    def __init__(self, task_timeout_s: float = TASK_TIMEOUT_S) -> None:
        self.task_timeout_s = task_timeout_s
        self._numbers = itertools.count()
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
        number = next(self._numbers)
        for tasks in self._tasks:
            tasks.put((number, name, world_size, kwargs))
        deadline = time.monotonic() + self.task_timeout_s
        got: dict[int, Any] = {}
        errors = []
        while len(got) + len(errors) < MAX_WORLD:
            try:
                answer, rank, ok, payload = self._results.get(timeout=max(0.0, deadline - time.monotonic()))
            except queue.Empty:
                self._dump_stacks_and_restart()
                raise TimeoutError(
                    f"{name} at world size {world_size}: no answer in {self.task_timeout_s} s (worker stacks were "
                    "written to stderr; the pool was restarted)"
                ) from None
            if answer != number:
                continue  # a late answer to an abandoned task
            if ok:
                got[rank] = torch.load(io.BytesIO(payload), weights_only=False)
            else:
                errors.append(f"--- rank {rank}\n{payload}")
        if errors:
            raise WorkerError(f"{name} at world size {world_size} failed:\n" + "\n".join(errors))
        return [got[r] for r in range(world_size)]

    def _dump_stacks_and_restart(self) -> None:
        for proc in self._procs:
            if proc.is_alive() and proc.pid is not None:
                os.kill(proc.pid, signal.SIGUSR1)  # faulthandler: every thread's stack to stderr
        time.sleep(2)
        self._restart()

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
