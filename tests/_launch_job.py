"""`gr00t-train launch` jobs for the multi-process tests: each rank's stderr in a file of its own (torchrun's
--log-dir), faults injected by `_faults/sitecustomize.py`, and every process killed when the test ends."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

FAULTS = Path(__file__).with_name("_faults")


@dataclass
class Job:
    """A running launcher: its process, its folder (rank logs, exit codes, fault times) and start time."""

    proc: subprocess.Popen
    folder: Path
    started: float

    def finish(self, timeout: float) -> tuple[int, str]:
        """(exit code, the launcher's own output); past `timeout` everything is killed and the test fails."""
        try:
            output, _ = self.proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.kill()
            output, _ = self.proc.communicate()
            raise AssertionError(f"the job ran past {timeout} s:\n{output[-3000:]}") from None
        finally:
            self.kill()  # a worker left behind, if any
        return self.proc.returncode, output

    def kill(self) -> None:
        for pid in [*descendants(self.proc.pid), self.proc.pid]:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)

    def rank_stderr(self, local_rank: int) -> str:
        """What one rank wrote on stderr (torchrun's --log-dir layout: <run>/attempt_0/<local rank>/)."""
        files = list((self.folder / "logs").glob(f"*/attempt_0/{local_rank}/stderr.log"))
        assert len(files) == 1, files
        return files[0].read_text()

    def exit_code(self, rank: int) -> str | None:
        """The code rank `rank`'s `gr00t-train train` returned (None: it never returned)."""
        path = self.folder / f"rank{rank}.rc"
        return path.read_text() if path.is_file() else None

    def fault_time(self, rank: int) -> float:
        return float((self.folder / f"fault{rank}.time").read_text())


def start(folder: Path, argv: list[str], launch: list[str], faults: str = "") -> Job:
    """`gr00t-train launch *launch train ...argv[1:]` with one compute thread per rank."""
    folder.mkdir(parents=True, exist_ok=True)
    env = {
        **os.environ,
        "OMP_NUM_THREADS": "1",
        "PYTHONPATH": os.pathsep.join(p for p in (str(FAULTS), os.environ.get("PYTHONPATH")) if p),
        "GR00T_TEST_FAULT": faults,
        "GR00T_TEST_RC_DIR": str(folder),
    }
    assert argv[0] == "train", argv
    cmd = [sys.executable, "-m", "gr00t_train", "launch", *launch, "--log-dir", str(folder / "logs"),
           "--redirects", "3", *argv]  # fmt: skip
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True)  # fmt: skip
    return Job(proc, folder, time.monotonic())


def descendants(pid: int) -> list[int]:
    """Every process below `pid` (torchrun starts its ranks in sessions of their own)."""
    children: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue  # gone meanwhile
        children.setdefault(int(fields[1]), []).append(int(stat.parent.name))
    found, todo = [], [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found
