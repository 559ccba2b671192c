"""How checkpoint files are written and read: pickles through file objects (a failed write names its file),
loads that accept tensors and plain containers only (refused in our words), and fsyncs before a rename.

Pickles are written without torch.save's CRC-32 of every zip record: it is computed in the writing thread,
0.22 s per GB on dev-cpu (`benchmarks/probes/checkpoint_write.py`: a 3.2 GB optimizer file's torch.save 1.40
-> 0.70 s; about 4 s of an n1.6-3b save's 19.4 GB at that rate), while the checkpoint's manifest already
holds a SHA-256 of every file, which resume checks, and torch.load does not read the CRC (an outside unzip of
a .pt file would warn of it). torch keeps the switch per thread: set around our writes, it changes no other
torch.save."""

from __future__ import annotations

import contextlib
import json
import os
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch

from .._errors import CheckpointError


def _torch_save(obj: Any, path: Path) -> None:
    # Through a file object: a failed write raises OSError with its errno (given a path, torch's zip writer
    # raises a bare RuntimeError), named here with the file it was writing.
    try:
        with open(path, "wb") as f, _no_zip_crc():
            torch.save(obj, f)
    except OSError as err:
        raise OSError(err.errno, err.strerror, str(path)) from err
    except RuntimeError as err:
        cause = err.__context__
        if isinstance(cause, OSError) and cause.filename is None:
            raise OSError(cause.errno, cause.strerror, str(path)) from err
        raise


@contextlib.contextmanager
def _no_zip_crc() -> Iterator[None]:
    """torch.save without its CRC-32 (module docstring), in this thread, for the block."""
    if not hasattr(torch.serialization, "set_crc32_options"):  # torch before 2.6
        yield
        return
    before = torch.serialization.get_crc32_options()
    torch.serialization.set_crc32_options(False)
    try:
        yield
    finally:
        torch.serialization.set_crc32_options(before)


def _torch_load(path: Path) -> Any:
    try:
        return torch.load(path, map_location="cpu", weights_only=True)
    except Exception as err:  # noqa: BLE001 - said in our words (torch's would suggest weights_only=False)
        raise CheckpointError(unreadable(path, err)) from None


def unreadable(file: Path, err: BaseException) -> str:
    """Why `file` cannot be loaded, in our words: never torch's advice to load it with weights_only=False,
    which would run whatever code the file names."""
    found = re.search(r"GLOBAL ([\w.]+)", str(err))
    if found or "weights_only" in str(err):
        what = f"names {found.group(1)}" if found else "holds objects other than tensors and plain containers"
        return (
            f"{file} {what}: refused, since loading it could run code. gr00t-train writes only tensors and plain "
            "containers there, so the file was altered or comes from elsewhere; resume from another checkpoint."
        )
    return f"{file} cannot be read ({type(err).__name__}): it is damaged; resume from another checkpoint."


def _write_json(path: Path, data: dict[str, Any]) -> None:
    path.write_text(json.dumps(data, indent=2) + "\n")


def _fsync_tree(folder: Path) -> None:
    # Data must be on disk before the rename makes the checkpoint visible, or a crash could publish
    # a folder of truncated files.
    for path in sorted(folder.rglob("*")):
        if path.is_file():
            _fsync(path)
    _fsync(folder)


def _fsync(path: Path) -> None:
    """Flush a file's data, or a folder's entries, to disk."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
