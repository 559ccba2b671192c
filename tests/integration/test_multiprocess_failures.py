"""A rank of a two-rank `gr00t-train launch` job (gloo on CPU) dies: the survivor exits promptly with one line
naming the dead rank and the newest intact checkpoint, and the launcher one line naming the rank that failed
first. A SIGTERM to the whole job still stops every rank with a checkpoint and exit code 143.

Faults come from tests/_faults/sitecustomize.py, injected into the ranks of a real job."""

from __future__ import annotations

import os
import re
import signal
import time

import pytest
from _launch_job import descendants, start
from gr00t_train import Checkpointer
from gr00t_train._peers import HANG_GRACE_S, ROLL_CALL_S

TWO_RANKS = ["--nproc-per-node", "2"]


def _error_lines(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if "error:" in line]


@pytest.mark.slow
@pytest.mark.timeout(180)
@pytest.mark.parametrize("fault", ["raise", "kill"])
def test_the_survivor_of_a_dead_rank_names_it_and_the_newest_checkpoint(
    dataset, tmp_path, train_args, fault
) -> None:
    out = tmp_path / "run"
    argv = train_args(dataset, out, "steps=12", "checkpoint.every=2")
    job = start(tmp_path / "job", argv, TWO_RANKS, faults=f"1:5:{fault}")  # rank 1 dies after step 5
    code, output = job.finish(timeout=150)

    assert code == 1, output[-3000:]
    how = "exited with code 1" if fault == "raise" else "was killed by SIGKILL"
    assert re.search(rf"gr00t-train launch: error: rank 1 \(local rank 1, pid \d+\) {how} first;", output), (
        output
    )
    survivor = job.rank_stderr(0)
    newest = out / "checkpoints" / "step_000004"
    if fault == "raise":
        lost = r"rank 1 died after step 5 \(RuntimeError: injected fault on rank 1\)"
    else:
        lost = r"rank 1 stopped answering after step 5 \(killed, or its node went down; its own output may say why\)"
    expected = (
        rf"gr00t-train train: error: {lost}; this process cannot write a checkpoint without it. "
        rf"The newest intact checkpoint is {re.escape(str(newest))}: continue with --resume"
    )
    assert len(_error_lines(survivor)) == 1 and re.fullmatch(expected, _error_lines(survivor)[0]), survivor
    assert "Traceback" not in survivor and "Connection closed by peer" not in survivor  # no gloo traceback
    if fault == "raise":  # the launcher stopped it because rank 1 died: no stop to promise
        assert "SIGTERM received" not in survivor
    assert Checkpointer(out / "checkpoints", keep_last=5).newest_intact()[0] == newest
    assert job.exit_code(0) == "1"
    # Prompt: the note or the roll call, then the ranks' teardown; not a collective's 30-minute timeout.
    ended = (job.folder / "rank0.rc").stat().st_mtime
    assert ended - job.fault_time(1) < ROLL_CALL_S + 15


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_a_survivor_stuck_in_a_collective_still_reports_and_exits(dataset, tmp_path, train_args) -> None:
    # Rank 0 hangs where rank 1 dies (as in an NCCL collective that waits out its timeout): after the grace
    # period the peer watch's thread says the line and ends the process.
    out = tmp_path / "run"
    argv = train_args(dataset, out, "steps=12", "checkpoint.every=2")
    job = start(tmp_path / "job", argv, TWO_RANKS, faults="1:5:raise,0:5:hang")
    code, output = job.finish(timeout=150)

    assert code == 1, output[-3000:]
    survivor = job.rank_stderr(0)
    lines = _error_lines(survivor)
    assert len(lines) == 1 and lines[0].startswith(
        "gr00t-train train: error: rank 1 died after step 5 (RuntimeError: injected fault on rank 1); "
    ), survivor
    assert lines[0].endswith(f"{out / 'checkpoints' / 'step_000004'}: continue with --resume")
    assert job.exit_code(0) is None  # ended by the thread, not by a return from the hung loop
    ended = max(p.stat().st_mtime for p in (job.folder / "logs").glob("*/attempt_0/0/stderr.log"))
    assert HANG_GRACE_S <= ended - job.fault_time(1) < HANG_GRACE_S + 10


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_sigterm_to_the_whole_job_stops_every_rank_with_a_checkpoint(dataset, tmp_path, train_args) -> None:
    # A scheduler's preemption: SIGTERM to the launcher and to every rank at once.
    out = tmp_path / "run"
    job = start(tmp_path / "job", train_args(dataset, out, "steps=300"), TWO_RANKS)
    deadline = time.monotonic() + 120
    while not (out / "metrics.jsonl").is_file() or not (out / "metrics.jsonl").read_text():
        assert job.proc.poll() is None and time.monotonic() < deadline, "training did not start"
        time.sleep(0.1)
    for pid in [job.proc.pid, *descendants(job.proc.pid)]:
        os.kill(pid, signal.SIGTERM)  # the data workers ignore it
    code, output = job.finish(timeout=90)

    assert code == 128 + signal.SIGTERM, output[-3000:]
    assert job.exit_code(0) == job.exit_code(1) == str(128 + signal.SIGTERM)
    last = job.rank_stderr(0).strip().splitlines()[-1]
    match = re.fullmatch(
        r"gr00t-train train: stopped by SIGTERM at step (\d+): saved checkpoint (\S+); continue with --resume",
        last,
    )
    assert match, last
    saved = out / "checkpoints" / f"step_{int(match[1]):06d}"
    assert match[2] == str(saved) and Checkpointer(saved.parent, keep_last=5).newest_intact()[0] == saved
    assert "error" not in job.rank_stderr(1)  # rank 0 speaks for the agreed stop
