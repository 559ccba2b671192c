"""What passes between the pipeline's levels: bounded queues polled so that a stop request is never missed,
failures that travel downstream to the consumer, and how long each level waited on the one before it."""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable
from typing import Any

import torch

POLL_S = 0.1
IDLE_POLL_S = 0.005  # while copies are in flight, the idle copy thread hands their memory back this soon


class WaitStats:
    """Thread-safe totals of waiting and busy seconds per pipeline level."""

    NAMES = ("l1_wait", "l2_wait", "l3_wait", "transform", "device")

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.reset()

    def reset(self) -> None:
        """Zero everything."""
        with self._lock:
            self._totals = dict.fromkeys(self.NAMES, 0.0)
            self.batches = 0

    def add(self, name: str, seconds: float) -> None:
        """Add seconds to one total."""
        with self._lock:
            self._totals[name] += seconds

    def summary(self) -> dict[str, float]:
        """Totals in seconds (`<name>_s`) and per delivered batch in milliseconds (`<name>_ms`)."""
        with self._lock:
            out: dict[str, float] = {"batches": float(self.batches)}
            for name, total in self._totals.items():
                out[f"{name}_s"] = total
                out[f"{name}_ms"] = 1000.0 * total / max(self.batches, 1)
            return out


class Failed:
    """An exception travelling downstream to the consumer."""

    def __init__(self, error: BaseException) -> None:
        self.error = error


def put(q: queue.Queue, item: Any, stop: threading.Event) -> bool:
    """Put `item` into `q`, waiting for room; False if `stop` was set first."""
    while not stop.is_set():
        try:
            q.put(item, timeout=POLL_S)
            return True
        except queue.Full:
            continue
    return False


def get(q: queue.Queue, stop: threading.Event, idle: Callable[[], bool] | None = None) -> Any:
    """The next item; while waiting, `idle()` runs between polls (it returns True to be called again soon)."""
    while not stop.is_set():
        soon = idle() if idle is not None else False
        try:
            return q.get(timeout=IDLE_POLL_S if soon else POLL_S)
        except queue.Empty:
            continue
    raise InterruptedError("pipeline stopped")


def one_thread() -> None:
    """One intra-op thread for torch work in this thread (copies, the transforms): a copy split over every
    core wakes an OpenMP team that then spins, taking cores from the decoding workers. Like torch's own
    pin-memory thread; threads started later inherit the setting, the caller's thread keeps its own."""
    torch.set_num_threads(1)
