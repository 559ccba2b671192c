"""An exclusive lock on a folder, held for the life of a run, that names its holder to anyone refused.

POSIX record locks (`fcntl.lockf`): the kernel drops them when the holder dies (kill -9 included), and,
unlike `flock`, forked children (data workers) do not inherit them, so a dead run's orphaned workers can
never keep its folder locked. A process must open the lock file only once: closing any descriptor of it
would drop the lock, which is why run claims are re-entrant (see `_run_folder`).
"""

from __future__ import annotations

import errno
import fcntl
import json
import logging
import os
import socket
import time
from pathlib import Path

from ._errors import RunFolderError

log = logging.getLogger(__name__)
LOCK_FILE = ".gr00t-train.lock"


class FolderLock:
    """Holds `<folder>/.gr00t-train.lock`; `release()` lets it go."""

    def __init__(self, path: Path, fd: int | None) -> None:
        self.path = path
        self._fd = fd

    @classmethod
    def acquire(cls, folder: Path, setting: str) -> FolderLock:
        """Lock `folder` (created if needed) or raise RunFolderError naming the live holder."""
        folder.mkdir(parents=True, exist_ok=True)
        path = folder / LOCK_FILE
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as err:
            os.close(fd)
            if err.errno in (errno.EACCES, errno.EAGAIN):
                raise RunFolderError(
                    setting,
                    f"{folder} is in use by another run: {_holder(path)}. Wait for it to finish, stop it, "
                    f"or choose another {setting}",
                ) from None
            # A file system without locks (some network mounts): run unguarded rather than not at all.
            log.warning(
                "cannot lock %s (%s): nothing stops a second run from using it at the same time", path, err
            )
            return cls(path, None)
        holder = {
            "pid": os.getpid(),
            "host": socket.gethostname(),
            "since": time.strftime("%Y-%m-%d %H:%M:%S"),
        }
        os.ftruncate(fd, 0)
        os.pwrite(fd, (json.dumps(holder) + "\n").encode(), 0)
        return cls(path, fd)

    def release(self) -> None:
        """Unlock (the file stays: removing it would race with a run that is opening it)."""
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None


def _holder(path: Path) -> str:
    try:
        info = json.loads(path.read_text())
        return f"pid {info['pid']} on host {info['host']}, since {info['since']}"
    except (OSError, ValueError, KeyError, TypeError):
        return "a process that has not yet said who it is"
