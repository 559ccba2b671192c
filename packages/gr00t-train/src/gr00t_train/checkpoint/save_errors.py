"""A failed checkpoint write in our words: a full disk or an unwritable folder, named with the file, what is
intact, and how to continue."""

from __future__ import annotations

import errno
import os
from pathlib import Path

from .._errors import CheckpointError


def save_error(err: BaseException, final: Path, tmp: Path, kept: list[str]) -> CheckpointError | None:
    """The CheckpointError for `err` raised while writing checkpoint `final` (through `tmp`), given the run's
    intact checkpoints `kept`; None when `err` is not a write error (a bug: re-raised as it is)."""
    reason = disk_full(err, final.parent)
    failed = os_error(err)
    if reason is None and failed is None:
        return None
    if reason is not None:
        advice = "Free space on that disk, lower checkpoint.keep_last or point checkpoint.dir elsewhere"
    else:
        code = errno.errorcode.get(failed.errno) if failed.errno else None
        detail = ", ".join(x for x in (code, f"writing {failed.filename or tmp}") if x)
        reason = f"{failed.strerror or failed} ({detail})"
        advice = "Make that folder writable (or point checkpoint.dir elsewhere)"
    resume = (
        f", then continue with --resume (from {kept[-1]})"
        if kept
        else "; no checkpoint of this run exists yet, so the run must start again"
    )
    return CheckpointError(
        f"cannot write checkpoint {final}: {reason}. The partial save was removed; earlier "
        f"checkpoints are intact ({', '.join(kept) or 'none'}). {advice}{resume}."
    )


def os_error(err: BaseException | None) -> OSError | None:
    """The OSError behind `err` (itself, or what it was raised from), if any."""
    seen = 0
    while err is not None and seen < 8:
        if isinstance(err, OSError):
            return err
        err, seen = err.__cause__ or err.__context__, seen + 1
    return None


def disk_full(err: BaseException | None, root: Path) -> str | None:
    """A message if `err` (or what it was raised from) means the disk is full. torch's zip writer replaces
    the OSError with a RuntimeError on its way out; safetensors keeps only the text."""
    seen = 0
    while err is not None and seen < 8:
        if isinstance(err, OSError) and err.errno in (errno.ENOSPC, errno.EDQUOT):
            return f"{os.strerror(err.errno)} ({errno.errorcode[err.errno]}, writing {err.filename or root})"
        text = str(err)
        if "No space left on device" in text or "os error 28" in text:
            return f"No space left on device (ENOSPC; {type(err).__name__}: {text.strip()[:200]})"
        err, seen = err.__cause__ or err.__context__, seen + 1
    return None
