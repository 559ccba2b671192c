"""Where each step's time goes. On CUDA the phases are timed with events on the compute stream, so a phase
measures how long the GPU spent in it (for `data_wait` and `comm`: how long the GPU sat idle waiting); on
CPU with the host clock. Events are read only when the caller asks (at log time), never forcing a sync."""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager

import torch

PHASES = ("data_wait", "h2d", "compute", "comm", "optimizer", "optimizer_overlapped")
"""h2d runs on the pipeline's thread and optimizer_overlapped on a side stream: both overlap the step."""


class StepTimes:
    """The timings of one step; `seconds()` resolves them (synchronizing on CUDA events if needed)."""

    def __init__(self, nested: dict[str, str] | None = None) -> None:
        self._nested = nested or {}
        self._host: dict[str, float] = {}
        self._events: list[tuple[str, torch.cuda.Event, torch.cuda.Event]] = []

    def seconds(self) -> dict[str, float]:
        """Seconds per phase, plus `step` (the whole step)."""
        out = dict.fromkeys((*PHASES, "step"), 0.0)
        for name, value in self._host.items():
            out[name] = out.get(name, 0.0) + value
        for name, start, end in self._events:
            if not end.query():  # by a flush nearly every event is complete: no call into the driver's wait
                end.synchronize()
            out[name] = out.get(name, 0.0) + start.elapsed_time(end) / 1000.0
        for inner, outer in self._nested.items():  # report the outer phase without the inner one
            out[outer] = max(0.0, out[outer] - out[inner])
        return out


class StepTimer:
    """Times the phases of consecutive steps."""

    def __init__(self, device: torch.device, nested: dict[str, str] | None = None) -> None:
        """`nested` maps a phase timed inside another to that outer phase (e.g. comm inside compute)."""
        self.cuda = device.type == "cuda"
        self._nested = nested or {}
        self._current = StepTimes(self._nested)
        self._last_end = None

    def _mark(self):
        if self.cuda:
            event = torch.cuda.Event(enable_timing=True)
            event.record()
            return event
        return time.perf_counter()

    def _store(self, name: str, start, end) -> None:
        if self.cuda:
            self._current._events.append((name, start, end))
        else:
            self._current._host[name] = self._current._host.get(name, 0.0) + (end - start)

    def begin_step(self) -> None:
        """Start timing a new step, and (`between_steps`) how long since the previous one ended: on CUDA, how
        long the device sat idle for the loop's host work that no queued step hid (a save's stall, a
        validation, a log flush, a host fallen behind)."""
        self._current = StepTimes(self._nested)
        self._step_start = self._mark()
        if self._last_end is not None:
            self._store("between_steps", self._last_end, self._step_start)

    @contextmanager
    def phase(self, name: str) -> Iterator[None]:
        """Time the enclosed block as `name`."""
        start = self._mark()
        try:
            yield
        finally:
            self._store(name, start, self._mark())

    def add(self, name: str, seconds: float) -> None:
        """Add a duration measured elsewhere (for example the pipeline's host-to-device copy)."""
        self._current._host[name] = self._current._host.get(name, 0.0) + seconds

    def end_step(self) -> StepTimes:
        """Finish the step; returns its (possibly still unresolved) times."""
        self._last_end = self._mark()
        self._store("step", self._step_start, self._last_end)
        return self._current


class LapClock:
    """Consecutive parts of some host work (a save's stall or write, the session's end): `lap(name)` books
    the seconds since the last lap under `name`."""

    def __init__(self) -> None:
        self.started = self._last = time.perf_counter()
        self.laps: dict[str, float] = {}

    def lap(self, name: str) -> None:
        now = time.perf_counter()
        self.laps[name] = self.laps.get(name, 0.0) + now - self._last
        self._last = now

    def total(self) -> float:
        return self._last - self.started
