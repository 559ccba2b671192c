"""What a run's dataset looked like: the contents of its `meta/` files (info, statistics, episodes, tasks)
and the size of every other file (parquet, mp4). A checkpoint records it, so a resume notices a dataset
changed in place (statistics rewritten, episodes added, a video replaced) as well as a moved copy."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

from ..checkpoint.manifest import file_digests

FINGERPRINT_FILE = "dataset_fingerprint.json"
"""Checkpoint file holding `fingerprint(dataset)`."""


def fingerprint(dataset: str | Path) -> dict[str, Any] | None:
    """{"meta": {path: sha256}, "files": {path: bytes}} with paths relative to the dataset root; hidden
    folders (a download tool's `.cache`) are left out. None when the dataset has no meta/ folder."""
    root = Path(dataset)
    meta = root / "meta"
    try:
        meta_files = sorted(p for p in meta.rglob("*") if p.is_file())
        if not meta_files:
            return None
        digests = file_digests(meta_files)
        others = sorted(
            p
            for p in root.rglob("*")
            if p.is_file() and not p.is_relative_to(meta) and not _hidden(p.relative_to(root))
        )
        sizes = {p.relative_to(root).as_posix(): p.stat().st_size for p in others}
    except OSError:
        return None
    return {"meta": {p.relative_to(root).as_posix(): digests[p][1] for p in meta_files}, "files": sizes}


def _hidden(relative: Path) -> bool:
    return any(part.startswith(".") for part in relative.parts)


def meta_digest(found: dict[str, Any] | None) -> str | None:
    """One SHA-256 over the meta/ files' names and digests: what checkpoints recorded before the file sizes
    (trainer_state.json's `dataset_meta_sha256`), equal for a moved copy."""
    if not found:
        return None
    total = hashlib.sha256()
    for name, digest in sorted(found["meta"].items()):
        total.update(f"{name.removeprefix('meta/')}\0{digest}\n".encode())
    return total.hexdigest()


def differences(before: dict[str, Any], now: dict[str, Any] | None, limit: int = 4) -> str | None:
    """What changed between two fingerprints, e.g. `1 file changed (meta/stats.json); 40 files added
    (data/chunk-000/episode_000020.parquet, ...)`; None when they are equal."""
    if now is None:
        return "its meta/ folder is gone"
    found = []
    for kind in ("meta", "files"):
        old, new = before.get(kind, {}), now.get(kind, {})
        changed = sorted(k for k in old.keys() & new.keys() if old[k] != new[k])
        for label, names in (
            ("changed" if kind == "meta" else "changed size", changed),
            ("added", sorted(new.keys() - old.keys())),
            ("removed", sorted(old.keys() - new.keys())),
        ):
            if names:
                shown = ", ".join(names[:limit]) + (", ..." if len(names) > limit else "")
                found.append(f"{len(names)} {'file' if len(names) == 1 else 'files'} {label} ({shown})")
    return "; ".join(found) or None


def write_fingerprint(found: dict[str, Any] | None, folder: Path) -> None:
    """Record `found` in a checkpoint folder (nothing when the dataset had no meta/ folder)."""
    if found is not None:
        (folder / FINGERPRINT_FILE).write_text(json.dumps(found, indent=1, sort_keys=True) + "\n")


def read_fingerprint(folder: Path) -> dict[str, Any] | None:
    """What a checkpoint recorded of its dataset (None: written before the file sizes were recorded)."""
    try:
        found = json.loads((folder / FINGERPRINT_FILE).read_text())
    except (OSError, ValueError):
        return None
    return found if isinstance(found, dict) and "meta" in found else None
