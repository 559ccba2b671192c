"""Checkpoint writes beside training: one background thread per write, at most one in flight, and the record
of every save (how long the loop stalled, how long the write took, how many bytes) for the log and
summary.json.

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
        self._job, self._ready, self._speaks = job, ready, speaks
        self._thread = threading.Thread(target=self._run, name=f"gr00t-train-save-{step}", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        started = time.perf_counter()
        try:
            self._ready()
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

    def facts(self) -> dict[str, Any]:
        """What summary.json reports (`checkpoint_*`)."""
        return {
            "checkpoint_stall_s": [round(s, 4) for s in self.stall_s],
            "checkpoint_update_wait_s": [round(s, 4) for s in self.update_wait_s],
            "checkpoint_write_s": [round(s, 3) for s in self.write_s],
            "checkpoint_bytes": list(self.bytes),
            "checkpoint_failures": list(self.failures),
        }

    def written(self, path: Path, seconds: float, background: bool) -> None:
        """A write that published `path` (rank 0: every rank's files are in it)."""
        size = sum(p.stat().st_size for p in path.rglob("*") if p.is_file())
        self.write_s.append(seconds)
        self.bytes.append(size)
        how = "in the background" if background else "in the loop"
        log.info("checkpoint %s written %s in %.2f s (%.1f MB)", path.name, how, seconds, size / 1e6)

    def failed(self, step: int, message: str, policy: str) -> None:
        """A write that failed (every rank records rank 0's account of it)."""
        self.failures.append({"step": step, "error": message, "on_error": policy})
