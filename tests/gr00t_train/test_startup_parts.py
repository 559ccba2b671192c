"""StartupClock.part: a phase split into parts, filed under the phase when it is marked, with the time after
the last part as "other", so the parts add up to the phase."""

from __future__ import annotations

import logging
import time

from gr00t_train.metrics.startup import StartupClock


def test_parts_add_up_to_their_phase_and_are_logged(caplog) -> None:
    clock = StartupClock()
    clock.start(time.perf_counter())
    clock.mark("process_group")  # unsplit: no parts
    clock.part("first")
    time.sleep(0.01)
    clock.part("second")
    clock.part("first")  # named again: adds up
    time.sleep(0.005)
    with caplog.at_level(logging.INFO, logger="gr00t_train.metrics.startup"):
        clock.mark("model")
    clock.mark("data")
    parts = clock.parts["model"]
    assert list(parts) == ["first", "second", "other"]
    assert parts["second"] >= 0.01 and parts["other"] >= 0.005
    assert sum(parts.values()) == clock.phases["model"]  # the same clock readings
    assert clock.ordered_parts("model") == {name: round(value, 3) for name, value in parts.items()}
    assert clock.ordered_parts("process_group") == {} and clock.ordered_parts("data") == {}
    assert [r.getMessage() for r in caplog.records] == [
        "start-up, model phase: " + ", ".join(f"{n} {v:.1f} s" for n, v in parts.items())
    ]


def test_parts_before_start_or_after_the_first_step_are_ignored() -> None:
    clock = StartupClock()
    clock.part("weights")
    clock.mark("model")
    assert clock.parts == {} and clock.phases == {}
    clock.start(time.perf_counter())
    clock.first_step(0.0, None)
    clock.part("weights")
    clock.mark("model")
    assert clock.parts == {} and "model" not in clock.phases
