"""Where vla-io keeps what it derives from a dataset (statistics, decoded frames): a per-user cache folder,
never the dataset's own folder, which is often read-only or shared."""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
from pathlib import Path
from typing import Any

ENV = "VLA_IO_CACHE"


def user_cache_dir() -> Path:
    """`$VLA_IO_CACHE`, else `$XDG_CACHE_HOME/vla-io`, else `~/.cache/vla-io` (not created here)."""
    if os.environ.get(ENV):
        return Path(os.environ[ENV]).expanduser()
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base).expanduser() / "vla-io"


def dataset_folder(root: str | Path) -> str:
    """A folder name for one dataset: its name plus a hash of its absolute path (two datasets that share
    a name do not share cache entries)."""
    path = Path(root).resolve()
    digest = hashlib.sha256(str(path).encode()).hexdigest()[:12]
    return f"{path.name}-{digest}"


def write_json_atomic(path: Path, data: Any) -> None:
    """Write JSON through a temporary name and rename it: readers (another rank) never see half a file.
    Raises OSError when the folder cannot be created or written; the temporary file is removed then."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        tmp.write_text(json.dumps(data) + "\n")
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):  # no half-written leftovers (a full disk, a directory at `path`)
            tmp.unlink(missing_ok=True)
        raise
