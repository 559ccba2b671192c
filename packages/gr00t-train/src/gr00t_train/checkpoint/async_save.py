"""Checkpoint writes beside training: one background thread per write, at most one in flight, and the record
of every save (how long the loop stalled, how long the write took, how many bytes) for the log and
summary.json.

Per save the record splits the stall into its parts (`LapClock`: waiting for the previous write, the weights'
finite check, which waits for the step queued on the device, staging the random and data state, the optimizer
state and the model's tensors, the checkpoint folder), with the staging's own parts beside them (the wait for
the host pool's reservation, the pool's growth, the device snapshot's allocation and copies, the launch of the
host copies), and the device memory around it: `peak_before` of the first save is the steps' peak, and a
save whose `peak_after` exceeds its `peak_before` raised the run's peak.

The thread runs `Checkpointer.write`, which runs no collective (ranks report their parts through marker
files), so it never interleaves with training's collectives. Everything it writes was staged in host memory
on the main thread first (`checkpoint.staging`); it waits for those copies before reading them.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)


class BackgroundWrite:
    """One checkpoint write running in a daemon thread: `ready()` (the staged copies are done), then `job()`."""

    def __init__(self, step: int, job: Callable[[], Path], ready: Callable[[], None], speaks: bool) -> None:
        self.step = step
        self.path: Path | None = None
        self.error: BaseException | None = None
        self.seconds: float | None = None
        self.ready_s: float | None = None
        """Of `seconds`: the wait for the staged copies before writing."""
        self._job, self._ready, self._speaks = job, ready, speaks
        self._thread = threading.Thread(target=self._run, name=f"gr00t-train-save-{step}", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        started = time.perf_counter()
        try:
            self._ready()
            self.ready_s = time.perf_counter() - started
            self.path = self._job()
        except BaseException as err:  # noqa: BLE001 - reported where the run meets it (SaveLog.settle)
            self.error = err
            if self._speaks:  # at once, not at the next checkpoint
                log.error("the checkpoint of step %d could not be written: %s", self.step, err)
        finally:
            self.seconds = time.perf_counter() - started

    def join(self, timeout: float | None = None) -> bool:
        """Wait for the write; True when it has ended."""
        self._thread.join(timeout)
        return not self._thread.is_alive()


def describe_parts(parts: dict[str, Any]) -> str:
    """'settle 0.000 s, finite_check 0.210 s, ... (staging: pool_wait 0.000 s, ...)' for the log."""
    laps = ", ".join(f"{k} {v:.3f} s" for k, v in parts.items() if not isinstance(v, dict))
    inner = parts.get("staging") or {}
    return laps + (
        " (staging: " + ", ".join(f"{k} {v:.3f} s" for k, v in inner.items()) + ")" if inner else ""
    )


@dataclass
class SaveLog:
    """Every save of this session: the loop's stall, the write's seconds and bytes, and the failures."""

    stall_s: list[float] = field(default_factory=list)
    update_wait_s: list[float] = field(default_factory=list)
    """Per save: how long the first optimizer update after it waited on the device for its copies
    (`Staging.update_wait_s`); the loop lost at most stall_s + update_wait_s to the save."""
    write_s: list[float] = field(default_factory=list)
    bytes: list[int] = field(default_factory=list)
    failures: list[dict[str, Any]] = field(default_factory=list)
    stall_parts_s: list[dict[str, Any]] = field(default_factory=list)
    """Per save: its stall by part (`LapClock` laps, which add up to stall_s) and `staging`'s own parts."""
    write_parts_s: list[dict[str, float]] = field(default_factory=list)
    """Per write (rank 0): its parts, which add up to write_s: the wait for the staged copies (`ready`), the
    decoding of 8-bit moments, then `Checkpointer.write`'s laps (this rank's file, the optimizer state, the
    model, the JSON files, the wait for the other ranks, the manifest's hashing, the fsync, the rename, the
    pruning); a write in the loop adds the barrier after it."""
    memory_gib: list[dict[str, float]] = field(default_factory=list)
    """Per save (CUDA): device memory allocated and peak when it began, its snapshot (held and newly
    allocated), and the peak once its copies ended (`Staging.memory`)."""

    def facts(self) -> dict[str, Any]:
        """What summary.json reports (`checkpoint_*`)."""
        return {
            "checkpoint_stall_s": [round(s, 4) for s in self.stall_s],
            "checkpoint_update_wait_s": [round(s, 4) for s in self.update_wait_s],
            "checkpoint_write_s": [round(s, 3) for s in self.write_s],
            "checkpoint_write_parts_s": [_rounded(p, 3) for p in self.write_parts_s],
            "checkpoint_bytes": list(self.bytes),
            "checkpoint_failures": list(self.failures),
            "checkpoint_stall_parts_s": [_rounded(p, 4) for p in self.stall_parts_s],
            "checkpoint_memory_gib": [_rounded(m, 3) for m in self.memory_gib],
            # the steps' peak, apart from any save's: the peak before the first save began
            "peak_memory_before_saves_gib": (
                round(self.memory_gib[0]["peak_before"], 3) if self.memory_gib else None
            ),
        }

    def written(self, path: Path, seconds: float, background: bool, parts: dict[str, float]) -> None:
        """A write that published `path` (rank 0: every rank's files are in it), in `parts`."""
        size = sum(p.stat().st_size for p in path.rglob("*") if p.is_file())
        self.write_s.append(seconds)
        self.write_parts_s.append(parts)
        self.bytes.append(size)
        how = "in the background" if background else "in the loop"
        log.info(
            "checkpoint %s written %s in %.2f s (%.1f MB): %s",
            path.name, how, seconds, size / 1e6, describe_parts(parts),
        )  # fmt: skip

    def failed(self, step: int, message: str, policy: str) -> None:
        """A write that failed (every rank records rank 0's account of it)."""
        self.failures.append({"step": step, "error": message, "on_error": policy})


def _rounded(values: dict[str, Any], digits: int) -> dict[str, Any]:
    return {k: _rounded(v, digits) if isinstance(v, dict) else round(v, digits) for k, v in values.items()}
