"""The base of a run's checkpoints: the model folder its frozen weights were loaded from (`model.checkpoint`),
named by path and by the size and SHA-256 of its weight files. Checkpoints record it instead of repeating
those tensors (`checkpoint/weights.py`); a resume (before the model is built), `infer` and `export` refuse a base that
is missing or changed, naming the file.

The weight files are hashed once per process (block-parallel, as manifests are: seconds for the 3 B release)
and the digests kept for the process's later saves, keyed by each file's size and modification time.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from .manifest import file_digests

log = logging.getLogger(__name__)

_WEIGHT_NAMES = ("config.json", "model.safetensors.index.json", "weights.json")
_CACHE: dict[tuple, dict[str, dict[str, Any]]] = {}


def weight_files(folder: Path) -> list[Path]:
    """The files a model folder's weights are read from: its safetensors and their index, config.json, and for
    one of our checkpoints weights.json and (when weights.json reads parameters from it) optimizer.pt."""
    folder = Path(folder)
    files = sorted(folder.glob("*.safetensors")) + [
        folder / n for n in _WEIGHT_NAMES if (folder / n).is_file()
    ]
    if (folder / "weights.json").is_file() and (folder / "optimizer.pt").is_file():
        files.append(folder / "optimizer.pt")  # the masters of its trainable parameters
    return sorted(files)


def digests(folder: Path) -> dict[str, dict[str, Any]]:
    """{file name: {bytes, sha256}} of a model folder's weight files (hashed once per process)."""
    files = weight_files(folder)
    key = (str(Path(folder).resolve()), *((f.name, f.stat().st_size, f.stat().st_mtime_ns) for f in files))
    if key not in _CACHE:
        found = file_digests(files)
        _CACHE[key] = {f.name: {"bytes": size, "sha256": sha} for f, (size, sha) in found.items()}
    return _CACHE[key]


def describe(folder: Path) -> dict[str, Any]:
    """What a checkpoint records of its base: the absolute path and the weight files' digests."""
    return {"path": str(Path(folder).resolve()), "files": digests(folder)}


def mismatch(recorded: dict[str, Any], folder: Path) -> str | None:
    """Why `folder` is not the base `recorded` describes (a missing, resized or changed file), or None."""
    folder = Path(folder)
    if not folder.is_dir():
        return f"{folder} does not exist"
    files = recorded.get("files", {})
    for name, entry in files.items():
        file = folder / name
        if not file.is_file():
            return f"{file} is missing"
        if file.stat().st_size != entry["bytes"]:
            return f"{file} has {file.stat().st_size} bytes, the checkpoint recorded {entry['bytes']}"
    found = digests(folder)
    extra = sorted(set(found) - set(files))
    if extra:
        return f"{folder / extra[0]} was not part of the base the checkpoint recorded"
    for name, entry in files.items():
        if found[name]["sha256"] != entry["sha256"]:
            return f"{folder / name} differs from the base the checkpoint recorded (SHA-256)"
    return None


def find_base(recorded: dict[str, Any], wanted: str | Path | None = None) -> tuple[Path, str | None]:
    """(folder, why it is not the recorded base or None): `wanted` (model.checkpoint) when given, else the
    recorded path. A base found at another path than recorded is said in a warning (it moved)."""
    path = Path(recorded["path"])
    folder = Path(wanted) if wanted else path
    reason = mismatch(recorded, folder)
    if reason is None and folder.resolve() != path.resolve():
        log.warning("the base %s of the checkpoint is now at %s (the same files)", path, folder)
    return folder, reason
