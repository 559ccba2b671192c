"""summary.json's session_parts_s: the host seconds around the steps (after the first step, the loop after it,
the end's parts), and benchmarks/time_to_model.py's split of a job's rest by them."""

from __future__ import annotations

import importlib.util
import json

from _boundaries import REPO
from gr00t_train import Trainer


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
    parts = split(40.0, summary, steps_s=120.0, stalls=[0.5, 0.5], validation_s=2.0)
    # between steps: 150 - (3 after step 1 + 120 steps + 1 stalls + 2 validation + 17 final wait) = 7
    assert parts == {
        "after_first_step": 3.0, "of_it_compile_cache_write": 2.5, "between_steps": 7.0, "final_save_wait": 17.0,
        "end": 1.5, "after_summary": 6.0, "unattributed": 40.0 - (3 + 7 + 17 + 1.5 + 6),
    }  # fmt: skip
    older = split(30.0, {"after_summary_s": 6.0}, steps_s=120.0, stalls=[], validation_s=0.0)
    assert "between_steps" not in older and older["unattributed"] == 24.0  # a summary without the parts
