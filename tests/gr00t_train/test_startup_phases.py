"""Start-up phases (_startup): run_training's clock splits start-up into phases that add up to startup_s, logs
them in one line and writes them into summary.json as startup_phases."""

from __future__ import annotations

import json
import logging
import time

from gr00t_train import Trainer
from gr00t_train.metrics.startup import PHASES, StartupClock, clock, seconds_since_process_start


def test_phases_add_up_to_startup_and_land_in_summary_json(tmp_path, env, standins, caplog) -> None:
    cfg = standins.small_config(tmp_path, steps=3, checkpoint__save_final="false")
    started = time.perf_counter()
    clock.start(started)
    clock.mark("process_group")
    parts = standins.make_parts()
    clock.mark("data")
    trainer = Trainer(cfg, parts, env)
    trainer.started_at = started
    clock.mark("optimizer")
    with caplog.at_level(logging.INFO, logger="gr00t_train.metrics.startup"):
        trainer.fit()
    phases = json.loads((tmp_path / "run" / "summary.json").read_text())["startup_phases"]
    assert list(phases) == [name for name in PHASES if name in phases]  # in order
    assert {"process_group", "data", "optimizer", "before_first_step", "compile", "first_step"} <= set(phases)
    assert all(value >= 0 for value in phases.values())
    assert phases["compile"] == 0.0  # nothing compiled on a CPU run of the stand-ins
    after_imports = sum(value for name, value in phases.items() if name != "imports")
    assert abs(after_imports - trainer.startup_s) < 0.01 + 1e-3 * trainer.startup_s
    assert phases.get("imports", 0.0) > 0 or seconds_since_process_start() is None
    assert any(
        r.getMessage().startswith("start-up: ") and "first_step" in r.getMessage() for r in caplog.records
    )


def test_first_step_splits_into_compile_capture_and_the_rest(monkeypatch) -> None:
    import gr00t_train.metrics.startup as startup

    monkeypatch.setattr(startup, "compile_seconds", lambda: 2.0)
    fresh = StartupClock()
    fresh.start(time.perf_counter())
    fresh.first_step(5.0, capture_s=1.5)
    assert (fresh.phases["compile"], fresh.phases["graph_capture"], fresh.phases["first_step"]) == (
        2.0,
        1.5,
        1.5,
    )
    unstarted = StartupClock()
    unstarted.mark("model")
    unstarted.first_step(1.0, None)
    assert unstarted.ordered() == {}


def test_compile_cache_counts_read_torch_compile_counters() -> None:
    import torch._dynamo.utils as dynamo_utils
    from gr00t_train.metrics.startup import CACHE_COUNTERS, compile_cache_counts

    counters = dynamo_utils.counters
    saved = {group: dict(counters[group]) for group in ("inductor", "aot_autograd")}
    try:
        for group in saved:
            counters[group].clear()
        assert compile_cache_counts() == {}  # nothing compiled: no report
        counters["inductor"]["fxgraph_cache_hit"] += 3
        counters["aot_autograd"]["autograd_cache_bypass"] += 1
        counts = compile_cache_counts()
        assert list(counts) == list(CACHE_COUNTERS)
        assert counts["fx_graph_hit"] == 3 and counts["aot_autograd_bypass"] == 1
        assert sum(counts.values()) == 4
    finally:
        for group, values in saved.items():
            counters[group].clear()
            counters[group].update(values)


def test_compile_time_parts_are_torch_compiles_own_timers_largest_first() -> None:
    import torch
    import torch._dynamo.utils as dynamo_utils
    from gr00t_train.metrics.startup import compile_time_parts

    saved = dict(dynamo_utils.cumulative_time_spent_ns)
    try:
        dynamo_utils.cumulative_time_spent_ns.clear()
        assert compile_time_parts() == {}  # nothing compiled: no report
        compiled = torch.compile(lambda x: torch.sin(x) + 1, backend="eager")
        compiled(torch.ones(3))
        parts = compile_time_parts()
        assert parts["entire_frame_compile"] > 0  # Dynamo's frame compile, timed by torch itself
        assert parts["total_wall_time"] == parts["entire_frame_compile"]  # no backward graph compiled
        assert list(parts.values()) == sorted(parts.values(), reverse=True)
        dynamo_utils.cumulative_time_spent_ns["made_up_timer"] = 10**12  # 1,000 s
        assert next(iter(compile_time_parts().items())) == ("made_up_timer", 1000.0)
    finally:
        dynamo_utils.cumulative_time_spent_ns.clear()
        dynamo_utils.cumulative_time_spent_ns.update(saved)
        torch._dynamo.reset()

