"""summary.json's session_parts_s: the host seconds around the steps (after the first step, the loop after it,
the log flushes' parts, the end's parts), the seconds between steps per step, and
benchmarks/time_to_model.py's split of a job's rest."""

from __future__ import annotations

import importlib.util
import json
import time

import pytest
import torch
from _boundaries import REPO
from gr00t_train import Trainer
from gr00t_train.metrics.records import Throughput, summarize
from gr00t_train.metrics.timing import StepTimer, StepTimes


def _time_to_model():
    spec = importlib.util.spec_from_file_location("time_to_model", REPO / "benchmarks" / "time_to_model.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_session_parts_cover_the_loop_after_the_first_step_and_the_end(tmp_path, env, standins) -> None:
    cfg = standins.small_config(tmp_path, steps=4, checkpoint__save_final="false")
    trainer = Trainer(cfg, standins.make_parts(), env)
    trainer.fit()
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    parts = summary["session_parts_s"]
    ends = {"end_write_wait", "end_model_release", "end_metrics_close", "end_data_close", "end_parts_close"}
    assert {"after_first_step", "loop_after_first_step"} | ends <= set(parts)
    assert all(value >= 0 for value in parts.values())
    rows = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    later_steps = sum(r["step_time_s"] for r in rows if r.get("kind") != "val")
    later_steps -= next(r["step_time_s"] for r in rows if r.get("kind") != "val")
    # on CPU a step's time is the host's clock inside the loop: the loop after step 1 holds steps 2-4
    assert parts["loop_after_first_step"] >= later_steps > 0
    assert parts["loop_after_first_step"] >= parts["after_first_step"]
    steps = [r for r in rows if r.get("kind") != "val"]
    between = [r["between_steps_s"] for r in steps]
    assert between[0] == 0.0 and all(b > 0 for b in between[1:])  # the loop's host work between steps
    assert summary["between_steps_s"] == sum(between)
    assert parts["loop_after_first_step"] >= later_steps + sum(between[1:])
    # the log flushes' host seconds by part (at least the last step's flush ran), inside the loop's time
    flushes = {k: v for k, v in parts.items() if k.startswith("flush_")}
    assert set(flushes) == {"flush_issue", "flush_device_sync", "flush_records", "flush_log"}
    assert 0 < sum(flushes.values()) <= parts["loop_after_first_step"]


def test_the_time_between_steps_is_apart_from_the_steps() -> None:
    timer = StepTimer(torch.device("cpu"))
    throughput = Throughput(samples_per_step=4)
    records = []
    for pause in (0.0, 0.05, 0.0):
        time.sleep(pause)
        timer.begin_step()
        time.sleep(0.01)
        records.append(throughput.record(len(records) + 1, 1.0, 1e-4, None, timer.end_step().seconds()))
    assert records[0].between_steps_s == 0.0  # none before the session's first step
    assert records[1].between_steps_s >= 0.05 > records[1].step_time_s >= 0.01
    assert records[2].between_steps_s < 0.05
    assert summarize(records, 1, throughput).between_steps_s == sum(r.between_steps_s for r in records)


class _Event:
    """A CUDA event's part that StepTimes reads: done or not, and whether anyone synchronized on it."""

    def __init__(self, ms: float, done: bool) -> None:
        self.ms, self.done, self.synchronized = ms, done, False

    def query(self) -> bool:
        return self.done

    def synchronize(self) -> None:
        self.synchronized = self.done = True

    def elapsed_time(self, end: _Event) -> float:
        assert end.done
        return end.ms - self.ms


def test_step_times_synchronize_only_on_events_not_yet_done() -> None:
    """A flush reads events already complete (it synced the stream): synchronize would let go of the GIL once
    per event, and each time the loop waits to take it back while other threads run Python (the data
    pipeline's; benchmarks/probes/flush_events.py)."""
    times = StepTimes()
    done, pending = _Event(30.0, True), _Event(50.0, False)
    times._events += [
        ("compute", _Event(0.0, True), done),
        ("optimizer_overlapped", _Event(40.0, True), pending),
    ]
    seconds = times.seconds()
    assert seconds["compute"] == pytest.approx(0.030)
    assert seconds["optimizer_overlapped"] == pytest.approx(0.010)
    assert not done.synchronized and pending.synchronized


def test_the_jobs_rest_splits_by_part_and_names_what_is_unattributed() -> None:
    split = _time_to_model().split_other
    summary = {
        "session_parts_s": {
            "after_first_step": 3.0, "compile_cache_write": 2.5, "loop_after_first_step": 150.0,
            "end_write_wait": 0.0, "end_data_close": 1.5,
        },
        "checkpoint_final_wait_s": {"write": 16.0, "staging_release": 1.0},
        "after_summary_s": 6.0,
    }  # fmt: skip
    parts = split(40.0, summary, steps_s=120.0, stalls=[0.5, 0.5], validation_s=2.0, step1_late=4.0)
    # between steps: 150 - (3 after step 1 + 120 steps + 1 stalls + 2 validation + 17 final wait) = 7, of it
    # 4 before step 2
    assert parts == {
        "after_first_step": 3.0, "of_it_compile_cache_write": 2.5, "before_step_2": 4.0, "between_steps": 3.0,
        "final_save_wait": 17.0, "end": 1.5, "after_summary": 6.0, "unattributed": 40.0 - (3 + 7 + 17 + 1.5 + 6),
    }  # fmt: skip
    older = split(30.0, {"after_summary_s": 6.0}, steps_s=120.0, stalls=[], validation_s=0.0)
    assert "between_steps" not in older and older["unattributed"] == 24.0  # a summary without the parts


def test_the_seconds_between_steps_split_by_saves_and_writes(tmp_path) -> None:
    rows = [{"step": s, "step_time_s": 1.0, "between_steps_s": 0.1} for s in range(1, 11)]
    rows[0]["between_steps_s"] = 0.0
    rows[4]["between_steps_s"] = 3.0  # step 5: after the save (and validation) of step 4
    rows.insert(5, {"kind": "val", "step": 4})
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    split = _time_to_model().idle_between_steps(tmp_path, every=4, writes_s=[2.0, 0.0], flush_every=3)
    # steps 4, 7 and 10 follow flushes; the write of 2 s covers steps 6 and 7 (1.1 s each; 7 counts as after
    # its flush); step 9 follows the save of step 8 (no write left); steps 1, 2, 3 and 8 are the rest
    assert split == {
        "after_save_or_validation": 3.1, "after_log_flush": 0.3, "during_writes": 0.1, "elsewhere": 0.3,
        "after_log_flush_steps": 3, "after_log_flush_ms_per_step": 100.0,
        "during_writes_steps": 1, "during_writes_ms_per_step": 100.0,
        "elsewhere_steps": 4, "elsewhere_ms_per_step": 75.0,
    }  # fmt: skip


def test_step_1s_late_end_is_what_its_event_time_holds_beyond_the_host_work(tmp_path) -> None:
    rows = [{"step": 1, "step_time_s": 60.0, "data_wait_s": 2.0}, {"step": 2, "step_time_s": 0.06}]
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    late = _time_to_model().step1_end_late
    summary = {"first_step_s": 46.0, "session_parts_s": {"after_first_step": 0.5}}
    assert late(tmp_path, summary) == pytest.approx(60.0 - 46.0 - 2.0 - 0.5)
    assert late(tmp_path, {}) == 0.0  # a summary without first_step_s
