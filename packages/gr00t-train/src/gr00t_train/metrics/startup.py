"""Where a run's start-up goes: seconds per phase, from the process's start to the end of the first step.

run_training starts the clock; each phase ends with `mark(name)` where it is done (the time since the previous
mark is that phase's). The first step splits into compilation (torch.compile's own count of its frame and
backward compiles), graph capture (vla_graph's report) and the rest of the step. One INFO line and
summary.json's `startup_phases` give the result, so a measurement shows where start-up goes without a profiler.
"""

from __future__ import annotations

import logging
import os
import sys
import time

log = logging.getLogger(__name__)

PHASES = ("imports", "process_group", "model", "data", "optimizer", "before_first_step", "compile",
          "graph_capture", "first_step")  # fmt: skip
"""In order: process start to run_training (interpreter, imports), process group and settings, model build
(weights, frozen-prefix preparation), data pipeline start, the trainer (wrapper, optimizer and its planning,
staged update), to the first step (a resume's load), then the first step's compilation, graph capture and
the rest of it."""


class StartupClock:
    """Seconds per start-up phase (see PHASES); phases not reached stay absent."""

    def __init__(self) -> None:
        self.phases: dict[str, float] = {}
        self._last: float | None = None

    def start(self, now: float) -> None:
        """The run begins at perf_counter() `now`; the time before it (since the process started) is imports."""
        self.phases = {}
        self._last = now
        before = seconds_since_process_start()
        if before is not None:
            self.phases["imports"] = max(0.0, before - (time.perf_counter() - now))

    def mark(self, name: str) -> None:
        """Phase `name` ends now (a phase marked twice adds up)."""
        if self._last is None:
            return
        now = time.perf_counter()
        self.phases[name] = self.phases.get(name, 0.0) + now - self._last
        self._last = now

    def first_step(self, seconds: float, capture_s: float | None) -> None:
        """The first step took `seconds` (ending now): split into compilation, graph capture and the rest."""
        if self._last is None:
            return
        compile_s = min(compile_seconds(), seconds)
        capture = min(capture_s or 0.0, seconds - compile_s)
        self.phases["before_first_step"] = self.phases.get("before_first_step", 0.0) + max(
            0.0, time.perf_counter() - self._last - seconds
        )
        self.phases.update(compile=compile_s, graph_capture=capture, first_step=seconds - compile_s - capture)
        self._last = None
        log.info("start-up: %s", ", ".join(f"{name} {value:.1f} s" for name, value in self.ordered().items()))

    def ordered(self) -> dict[str, float]:
        return {name: round(self.phases[name], 3) for name in PHASES if name in self.phases}


def compile_seconds() -> float:
    """Seconds torch.compile spent so far in this process (frames and backward graphs; 0 without it)."""
    if "torch._dynamo" not in sys.modules:
        return 0.0
    spent = getattr(sys.modules["torch._dynamo"].utils, "calculate_time_spent", None)
    return float(spent().get("total_wall_time", 0.0)) if spent is not None else 0.0


def seconds_since_process_start() -> float | None:
    """Seconds since this process started (Linux: /proc; None elsewhere)."""
    try:
        with open("/proc/self/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        with open("/proc/uptime") as f:
            uptime = float(f.read().split()[0])
    except (OSError, IndexError, ValueError):
        return None
    return max(0.0, uptime - int(fields[19]) / os.sysconf("SC_CLK_TCK"))  # field 22: starttime in ticks


clock = StartupClock()
"""The process's clock (one run at a time per process)."""
