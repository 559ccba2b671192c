"""Read-only datasets for tests: `chmod -R a-w`, plus a check that nothing in the folder changed, since the
tests may run as root, whom file modes do not stop from writing."""

from __future__ import annotations

import contextlib
import os
import stat
from collections.abc import Iterator
from pathlib import Path


def snapshot(root: Path) -> dict[str, tuple]:
    """Every entry under `root`: relative path -> (kind, size, mtime_ns) (directories: kind and mtime)."""
    out: dict[str, tuple] = {}
    for path in sorted(Path(root).rglob("*")):
        info = path.lstat()
        kind = "dir" if stat.S_ISDIR(info.st_mode) else "file"
        out[str(path.relative_to(root))] = (kind, info.st_size if kind == "file" else 0, info.st_mtime_ns)
    out["."] = ("dir", 0, Path(root).lstat().st_mtime_ns)
    return out


def _chmod_tree(root: Path, writable: bool) -> None:
    for path in [Path(root), *Path(root).rglob("*")]:
        mode = path.lstat().st_mode
        bits = stat.S_IWUSR | stat.S_IWGRP | stat.S_IWOTH
        os.chmod(path, (mode | stat.S_IWUSR) if writable else (mode & ~bits))


@contextlib.contextmanager
def read_only(root: Path) -> Iterator[Path]:
    """`root` made read-only for the block; on leaving, asserts that no entry was added, removed or changed
    (sizes and modification times), then makes it writable again (so temporary folders can be removed)."""
    before = snapshot(root)
    _chmod_tree(root, writable=False)
    try:
        yield root
    finally:
        after = snapshot(root)
        _chmod_tree(root, writable=True)
    added = sorted(set(after) - set(before))
    removed = sorted(set(before) - set(after))
    changed = sorted(k for k in set(before) & set(after) if before[k] != after[k])
    assert not (added or removed or changed), (
        f"the dataset folder {root} changed: added {added}, removed {removed}, changed {changed}"
    )
