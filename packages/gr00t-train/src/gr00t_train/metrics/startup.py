"""Where a run's start-up goes: seconds per phase, from the process's start to the end of the first step.

run_training starts the clock; each phase ends with `mark(name)` where it is done (the time since the previous
mark is that phase's). A phase may be split further with `part(name)` calls inside it (the model phase is:
MODEL_PARTS); whatever follows the last part is filed as "other", so a phase's parts add up to it. The first
step splits into compilation (torch.compile's own count of its frame and backward compiles), graph capture
(vla_graph's report) and the rest of the step. One INFO line and summary.json's `startup_phases` give the
result, one INFO line per split phase and `startup_model_parts` its parts, so a measurement shows where
start-up goes without a profiler. `startup_compile_caches` says whether compilation read torch.compile's
caches: a second run on the same caches should have hits only (a miss or bypass compiles that graph again);
`startup_compile_parts` gives torch.compile's own timers (where its compilation went).
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

MODEL_PARTS = ("run_folder", "data_plan", "imports", "start_facts", "tokenizer", "device", "weights",
               "adapters", "frozen_prefix", "device_sync")  # fmt: skip
"""The model phase's parts, in order (those that ran): the run folder claimed, the dataset's metadata
planned, the Python modules the model needs imported (the Triton attention op), the start-up warnings
(start_facts), the tokenizer, the device's context created (CUDA), the weights made (random init or the
checkpoint's load, with the training policy's dtypes), LoRA adapters, the frozen prefix prepared, and the
device's queued work waited for (CUDA); then "other", the rest of the phase."""


class StartupClock:
    """Seconds per start-up phase (see PHASES); phases not reached stay absent."""

    def __init__(self) -> None:
        self.phases: dict[str, float] = {}
        self.parts: dict[str, dict[str, float]] = {}
        self.compile_caches: dict[str, int] = {}  # compile_cache_counts() at the end of the first step
        self.compile_parts: dict[str, float] = {}  # compile_time_parts() then
        self._last: float | None = None  # when the previous phase ended (None: not running)
        self._last_part = 0.0  # when the previous part (or phase) ended
        self._pending: dict[str, float] = {}  # parts of the phase in progress

    def start(self, now: float) -> None:
        """The run begins at perf_counter() `now`; the time before it (since the process started) is imports."""
        self.phases, self.parts, self._pending, self.compile_caches, self.compile_parts = {}, {}, {}, {}, {}
        self._last = self._last_part = now
        before = seconds_since_process_start()
        if before is not None:
            self.phases["imports"] = max(0.0, before - (time.perf_counter() - now))

    def mark(self, name: str) -> None:
        """Phase `name` ends now (a phase marked twice adds up). Its parts, if `part` split it, are filed
        under it, the time after the last one as "other"."""
        if self._last is None:
            return
        now = time.perf_counter()
        self.phases[name] = self.phases.get(name, 0.0) + now - self._last
        if self._pending:
            self._pending["other"] = self._pending.get("other", 0.0) + now - self._last_part
            parts = self.parts.setdefault(name, {})
            for part, seconds in self._pending.items():
                parts[part] = parts.get(part, 0.0) + seconds
            self._pending = {}
            log.info("start-up, %s phase: %s", name, _line(self.ordered_parts(name)))
        self._last = self._last_part = now

    def part(self, name: str) -> None:
        """Part `name` of the phase in progress ends now: the time since the phase began or its previous part
        ended (a part named twice adds up)."""
        if self._last is None:
            return
        now = time.perf_counter()
        self._pending[name] = self._pending.get(name, 0.0) + now - self._last_part
        self._last_part = now

    def ordered_parts(self, phase: str) -> dict[str, float]:
        """The parts of `phase` in the order they ran, rounded as `ordered` rounds ({} if it was not split)."""
        return {name: round(value, 3) for name, value in self.parts.get(phase, {}).items()}

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
        log.info("start-up: %s", _line(self.ordered()))
        self.compile_caches = compile_cache_counts()
        if self.compile_caches:
            log.info(
                "start-up, compile caches: %s", ", ".join(f"{k} {v}" for k, v in self.compile_caches.items())
            )
        self.compile_parts = compile_time_parts()
        if self.compile_parts:
            log.info("start-up, compilation's timers: %s", _line(dict(list(self.compile_parts.items())[:12])))

    def ordered(self) -> dict[str, float]:
        return {name: round(self.phases[name], 3) for name in PHASES if name in self.phases}


def _line(seconds: dict[str, float]) -> str:
    return ", ".join(f"{name} {value:.1f} s" for name, value in seconds.items())


def compile_seconds() -> float:
    """Seconds torch.compile spent so far in this process (frames and backward graphs; 0 without it)."""
    if "torch._dynamo" not in sys.modules:
        return 0.0
    spent = getattr(sys.modules["torch._dynamo"].utils, "calculate_time_spent", None)
    return float(spent().get("total_wall_time", 0.0)) if spent is not None else 0.0


def compile_time_parts() -> dict[str, float]:
    """torch.compile's own timers so far in this process (seconds by name, largest first; nested timers
    overlap, so they do not add up): where compilation went (tracing, AOTAutograd, Inductor's lowering and
    code generation, the wait for its kernel compiles). {} without torch.compile."""
    if "torch._dynamo" not in sys.modules:
        return {}
    spent = getattr(sys.modules["torch._dynamo"].utils, "calculate_time_spent", None)
    timers = spent() if spent is not None else {}
    return {
        name: round(float(s), 3) for name, s in sorted(timers.items(), key=lambda kv: -kv[1]) if s >= 0.0005
    }


CACHE_COUNTERS = {  # name: (torch._dynamo.utils.counters group, key)
    "fx_graph_hit": ("inductor", "fxgraph_cache_hit"),
    "fx_graph_miss": ("inductor", "fxgraph_cache_miss"),
    "fx_graph_bypass": ("inductor", "fxgraph_cache_bypass"),
    "aot_autograd_hit": ("aot_autograd", "autograd_cache_hit"),
    "aot_autograd_miss": ("aot_autograd", "autograd_cache_miss"),
    "aot_autograd_bypass": ("aot_autograd", "autograd_cache_bypass"),
}


def compile_cache_counts() -> dict[str, int]:
    """How often torch.compile's FX graph and AOTAutograd caches hit, missed or were bypassed so far in this
    process ({} without torch.compile)."""
    if "torch._dynamo" not in sys.modules:
        return {}
    counters = sys.modules["torch._dynamo"].utils.counters
    counts = {name: int(counters[group][key]) for name, (group, key) in CACHE_COUNTERS.items()}
    return counts if any(counts.values()) else {}


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
