"""An exclusive lock on a folder, held for the life of a run, that names its holder to anyone refused.

POSIX record locks (`fcntl.lockf`): the kernel drops them when the holder dies (kill -9 included), and,
unlike `flock`, forked children (data workers) do not inherit them, so a dead run's orphaned workers can
never keep its folder locked. A process must open the lock file only once: closing any descriptor of it
would drop the lock, which is why run claims are re-entrant (see `run_folder.folder`).
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

from .._errors import RunFolderError

log = logging.getLogger(__name__)
LOCK_FILE = ".gr00t-train.lock"
_MINE: set[Path] = set()
"""Lock files this process holds (resolved): never opened again here (closing them would drop the lock)."""


class FolderLock:
    """Holds `<folder>/.gr00t-train.lock`; `release()` lets it go."""

    def __init__(self, path: Path, fd: int | None) -> None:
        self.path = path
        self._fd = fd

    @classmethod
    def acquire(cls, folder: Path, setting: str) -> FolderLock:
        """Lock `folder` (created if needed) or raise RunFolderError naming the live holder; a folder that
        cannot be created or written is a RunFolderError naming it (exit 2, before anything heavy)."""
        path = folder / LOCK_FILE
        try:
            folder.mkdir(parents=True, exist_ok=True)
            fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        except OSError as err:
            raise _unusable(folder, setting, err) from None
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
        try:
            os.ftruncate(fd, 0)
            os.pwrite(fd, (json.dumps(holder) + "\n").encode(), 0)
        except OSError as err:
            os.close(fd)
            raise OSError(err.errno, err.strerror, str(path)) from None  # name the file (a full disk)
        _MINE.add(path.resolve())
        return cls(path, fd)

    def release(self) -> None:
        """Unlock (the file stays: removing it would race with a run that is opening it)."""
        if self._fd is not None:
            _MINE.discard(self.path.resolve())
            os.close(self._fd)
            self._fd = None


def _unusable(folder: Path, setting: str, err: OSError) -> Exception:
    """Why `folder` cannot hold a run, as the error to raise (RunFolderError, or the OSError of a full disk)."""
    if err.errno in (errno.ENOSPC, errno.EDQUOT):
        return OSError(err.errno, err.strerror, err.filename or str(folder))
    blocker = next((p for p in (folder, *folder.parents) if p.exists() and not p.is_dir()), None)
    if blocker is not None:
        what = "is a file" if blocker == folder else f"cannot be created: {blocker} is a file"
        return RunFolderError(
            setting, f"{folder} {what}, not a folder; choose another {setting} or move the file away"
        )
    return RunFolderError(
        setting,
        f"{folder} cannot be written ({err.strerror}: {err.filename or folder}); make it writable or choose "
        f"another {setting}",
    )


def live_holder(folder: Path) -> str | None:
    """Who holds `folder`'s lock, if another live process does (None: no lock file, or nobody holds it)."""
    path = folder / LOCK_FILE
    try:
        if path.resolve() in _MINE or not path.is_file():
            return None
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return None
    try:
        fcntl.lockf(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except OSError as err:
        return _holder(path) if err.errno in (errno.EACCES, errno.EAGAIN) else None
    else:
        fcntl.lockf(fd, fcntl.LOCK_UN)
        return None
    finally:
        os.close(fd)


def held_below(folder: Path, max_depth: int = 6, max_folders: int = 5000) -> tuple[Path, str] | None:
    """A folder under `folder` (not `folder` itself) that another live run holds, with its holder, or None.
    Bounded: at most `max_depth` levels and `max_folders` folders are looked at."""
    base = len(folder.parts)
    for seen, (root, dirs, files) in enumerate(os.walk(folder), start=1):
        here = Path(root)
        if here != folder and LOCK_FILE in files:
            holder = live_holder(here)
            if holder is not None:
                return here, holder
        if len(here.parts) - base >= max_depth or seen >= max_folders:
            dirs[:] = []
    return None


def _holder(path: Path) -> str:
    try:
        info = json.loads(path.read_text())
        return f"pid {info['pid']} on host {info['host']}, since {info['since']}"
    except (OSError, ValueError, KeyError, TypeError):
        return "a process that has not yet said who it is"
