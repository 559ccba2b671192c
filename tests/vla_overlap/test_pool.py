"""The test harness itself: a task that hangs fails alone, and the next task runs on fresh workers."""

from __future__ import annotations

import pytest


def test_a_hung_task_fails_and_the_next_runs_on_fresh_workers(tmp_path) -> None:
    from _overlap_pool import WorkerPool

    pool = WorkerPool(task_timeout_s=20)
    try:
        first_pids = [p.pid for p in pool._procs]
        with pytest.raises(TimeoutError, match="hang_the_first_time at world size 2: no answer in 20 s"):
            pool.run("hang_the_first_time", 2, marker=str(tmp_path / "hung"))
        assert not set(first_pids) & {p.pid for p in pool._procs}
        assert pool.run("hang_the_first_time", 2, marker=str(tmp_path / "hung")) == [0, 1]
    finally:
        pool.close()
