"""A checkpoint folder's files hashed and flushed to disk while the rest is still being written.

`Checkpointer.write` hands each file to a `Seal` as soon as it is complete: its SHA-256 blocks go to a thread
pool and its fsync to a thread of its own, so the optimizer file's hashing and flushing run while the model
is written, and hashing (CPU, from the page cache) overlaps flushing (the disk). `finish` waits for what is
left, then writes the manifest last and flushes it and the folder, as `write_manifest` + `_fsync_tree` did
one after the other (on an H100 host, 2026-12-06: hashing 2.3 s, then fsync 2.5-3.5 s of a 22 GB save).
Flushed files leave the page cache (`_drop_cached`).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

from .files import _fsync
from .manifest import MANIFEST, block_digest, block_offsets, combine_blocks, manifest_text


def _drop_cached(path: Path) -> None:
    """Tell the kernel the file's pages (clean once flushed) need not stay cached: training never reads a
    checkpoint back, and 20 GB of them in the page cache make the next save's writes reclaim memory first
    (`benchmarks/probes/checkpoint_write.py` on dev-cpu: a 4 GB save 11.8 s beside cached older ones, 3.3 s
    without them)."""
    if not hasattr(os, "posix_fadvise"):  # not on macOS or Windows
        return
    fd = os.open(path, os.O_RDONLY)
    try:
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


class Seal:
    """Hashes and fsyncs the files of `folder` handed to it (`add`), then writes its manifest (`finish`).
    A context manager: leaving it stops the threads, abandoning queued work after a failure."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        workers = min(8, os.cpu_count() or 1)
        self._hashing = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="gr00t-train-hash")
        self._syncing = ThreadPoolExecutor(max_workers=1, thread_name_prefix="gr00t-train-fsync")
        self._files: dict[Path, tuple[int, list[Future[bytes]]]] = {}
        self._syncs: list[Future[None]] = []

    def __enter__(self) -> Seal:
        return self

    def __exit__(self, *exc: object) -> None:
        failed = exc[0] is not None
        self._hashing.shutdown(wait=True, cancel_futures=failed)
        self._syncing.shutdown(wait=True, cancel_futures=failed)

    def add(self, *paths: Path) -> None:
        """Files that are complete: none is written again before `finish`."""
        for path in paths:
            if path in self._files:
                continue
            size = path.stat().st_size
            blocks = [self._hashing.submit(block_digest, path, offset) for offset in block_offsets(size)]
            self._files[path] = (size, blocks)
            self._syncs.append(self._syncing.submit(_fsync, path))

    def add_rest(self, but: Callable[[Path], bool] = lambda path: False) -> None:
        """Every file under the folder not yet handed over (the model's files, other ranks' parts), `but`
        those still being written."""
        files = (p for p in self.folder.rglob("*") if p.is_file() and p.name != MANIFEST and not but(p))
        self.add(*sorted(files))

    def hashed(self) -> None:
        """Wait for every file's hash (the first failure raises)."""
        for _, blocks in self._files.values():
            for block in blocks:
                block.result()

    def finish(self, extra: dict[str, Any]) -> Path:
        """The manifest of every file, written once all are hashed and flushed, then flushed with the
        folders; returns its path. Call `hashed` first to time the hashing apart from the flushing."""
        self.add_rest()
        entries = {
            str(path.relative_to(self.folder)): {
                "bytes": size,
                "sha256": combine_blocks([b.result() for b in blocks]),
            }
            for path, (size, blocks) in sorted(self._files.items())
        }
        for sync in self._syncs:
            sync.result()
        for path in self._files:
            _drop_cached(path)
        manifest = self.folder / MANIFEST
        manifest.write_text(manifest_text(extra, entries))
        _fsync(manifest)
        for folder in sorted({p.parent for p in self._files} | {self.folder}, reverse=True):
            _fsync(folder)
        return manifest
