"""A checkpoint's manifest: the size and SHA-256 of every file, written last and checked before a resume,
so a truncated or damaged checkpoint is recognised (and skipped) instead of failing deep inside a loader.

Large files are hashed in 64 MiB blocks on a thread pool (hashlib releases the GIL): a file's digest is
the SHA-256 of its blocks' digests, so a 20 GB checkpoint is checked in seconds, not a minute.
"""

from __future__ import annotations

import hashlib
import json
import os
import zipfile
import zlib
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

MANIFEST = "manifest.json"
FORMAT = 1
_BLOCK = 64 * 2**20


def block_digest(path: Path, offset: int) -> bytes:
    """The SHA-256 of the block of `path` that begins at `offset`."""
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        f.seek(offset)
        left = _BLOCK
        while left > 0:
            chunk = f.read(min(left, 4 * 2**20))
            if not chunk:
                break  # the file shrank while being read: the digest will not match
            digest.update(chunk)
            left -= len(chunk)
    return digest.digest()


def block_offsets(size: int) -> range:
    """Where the blocks of a file of `size` bytes begin (an empty file has one, empty)."""
    return range(0, max(size, 1), _BLOCK)


def combine_blocks(blocks: list[bytes]) -> str:
    """A file's hex digest from its blocks' digests, in order."""
    return hashlib.sha256(b"".join(blocks)).hexdigest()


def file_digests(files: list[Path]) -> dict[Path, tuple[int, str]]:
    """(size in bytes, hex digest) of each file, hashed block by block on a thread pool."""
    sizes = {path: path.stat().st_size for path in files}
    jobs = [(path, offset) for path in files for offset in block_offsets(sizes[path])]
    with ThreadPoolExecutor(max_workers=min(8, os.cpu_count() or 1, max(1, len(jobs)))) as pool:
        blocks = list(pool.map(lambda job: block_digest(*job), jobs))
    per_file: dict[Path, list[bytes]] = {}
    for (path, _), block in zip(jobs, blocks):
        per_file.setdefault(path, []).append(block)
    return {path: (sizes[path], combine_blocks(per_file[path])) for path in files}


def manifest_text(extra: dict[str, Any], entries: dict[str, dict[str, Any]]) -> str:
    """manifest.json's text: `extra` (step, run id) and each file's {"bytes", "sha256"} by relative name."""
    return json.dumps({"format": FORMAT, **extra, "files": entries}, indent=1) + "\n"


def write_manifest(folder: Path, extra: dict[str, Any]) -> Path:
    """Record every file under `folder` (except the manifest itself) in `folder/manifest.json`."""
    files = sorted(p for p in folder.rglob("*") if p.is_file() and p.name != MANIFEST)
    entries = {
        str(p.relative_to(folder)): {"bytes": size, "sha256": digest}
        for p, (size, digest) in file_digests(files).items()
    }
    path = folder / MANIFEST
    path.write_text(manifest_text(extra, entries))
    return path


def check_manifest(folder: Path) -> str | None:
    """Why `folder` does not match its manifest (a missing, truncated or changed file), or None if it does.
    Without a manifest (written before manifests existed, or lost) the files' own structure is checked."""
    path = folder / MANIFEST
    if not path.is_file():
        return check_structure(folder)
    try:
        manifest = json.loads(path.read_text())
        entries = manifest["files"]
    except (OSError, ValueError, KeyError, TypeError) as err:
        return f"{MANIFEST} is unreadable ({type(err).__name__}: {err})"
    present: list[Path] = []
    if not isinstance(entries, dict) or not all(
        isinstance(e, dict) and isinstance(e.get("bytes"), int) and isinstance(e.get("sha256"), str)
        for e in entries.values()
    ):
        return f"{MANIFEST} is malformed (its `files` entries need bytes and sha256)"
    for name, entry in entries.items():
        file = folder / name
        if not file.is_file():
            return f"{name} is missing"
        size = file.stat().st_size
        if size != entry["bytes"]:
            return f"{name} has {size} bytes, the manifest says {entry['bytes']} (truncated or rewritten)"
        present.append(file)
    digests = file_digests(present)
    for file in present:
        name = str(file.relative_to(folder))
        if digests[file][1] != entries[name]["sha256"]:
            return f"{name} does not match its SHA-256 in {MANIFEST} (damaged on disk)"
    return None


def check_structure(folder: Path) -> str | None:
    """Why a checkpoint's files are visibly broken, judged by their formats alone: JSON parses, a safetensors
    file is as long as its header says, a torch zip archive has its directory and matching CRCs (where it has
    them: our .pt files are written without, their bytes covered by the manifest alone; `files`)."""
    for file in sorted(p for p in folder.rglob("*") if p.is_file()):
        name = str(file.relative_to(folder))
        try:
            if file.suffix == ".json":
                json.loads(file.read_text())
            elif file.suffix == ".safetensors":
                reason = _safetensors_length(file)
                if reason:
                    return f"{name}: {reason} (no {MANIFEST} to compare with)"
            elif file.suffix == ".pt":
                with zipfile.ZipFile(file) as archive:
                    bad = _record_failing_its_crc(archive)
                if bad is not None:
                    return f"{name}: record {bad} fails its CRC (no {MANIFEST} to compare with)"
        except (OSError, ValueError, zipfile.BadZipFile, EOFError, KeyError, RuntimeError, zlib.error) as err:
            return f"{name} is unreadable ({type(err).__name__}: {err}; no {MANIFEST} to compare with)"
    return None


def _record_failing_its_crc(archive: zipfile.ZipFile) -> str | None:
    """The first record whose bytes do not match its CRC-32, skipping records written without one (CRC 0 on
    non-empty bytes: torch.save with its CRC turned off)."""
    for info in archive.infolist():
        if info.CRC == 0 and info.file_size:
            continue
        try:
            with archive.open(info) as record:  # zipfile compares the CRC at the record's end
                while record.read(1 << 24):
                    pass
        except zipfile.BadZipFile:
            return info.filename
    return None


def _safetensors_length(file: Path) -> str | None:
    size = file.stat().st_size
    with open(file, "rb") as f:
        head = f.read(8)
        if len(head) < 8:
            return f"{size} bytes, too short for a header"
        length = int.from_bytes(head, "little")
        if length > size:
            return f"{size} bytes, shorter than its {length}-byte header"
        raw = f.read(length)
    try:  # any malformed header (a flipped byte) means damaged, whatever exception the parse raises
        header = json.loads(raw)
        end = max((int(v["data_offsets"][1]) for k, v in header.items() if k != "__metadata__"), default=0)
    except (ValueError, KeyError, TypeError, IndexError, AttributeError) as err:
        return f"its {length}-byte header is malformed ({type(err).__name__}: {err})"
    if size != 8 + length + end:
        return f"{size} bytes, its header describes {8 + length + end}"
    return None
