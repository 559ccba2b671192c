"""The files torch.compile's cache artifacts leave out, carried by `optimizations.compile_cache`.

On a fresh host with the artifacts loaded, the first step still made two kinds of files again (an H100 host,
n1.6-3b, 2026-12-05: first step 16.3 s against 8.8 s on warm local caches):
- Inductor's multi-kernel picks (`<Inductor cache>/<xx>/<key>.picked_kernel`): which of a reduction's two
  kernels runs faster, found by timing both at its first call (1.6-2 s for 50 reductions). The key hashes
  both kernels' sources, sizes and Triton options, so a pick holds wherever the same kernels compile.
- Triton kernels launched outside Inductor's graphs (vla-overlap's optimizer and gradient-cast kernels, and
  the like: 11 kernels, 3.6-4 s). Triton keeps each in its own cache, one folder per kernel source and
  compile options, whose `__grp__` file names the folder's files by absolute path. Which folders this process
  used is told by Triton's kernel-load hook; the kernels inside the compiled graphs (Inductor's `triton_*`,
  and user kernels such as gr00t-model's attention, which Inductor compiles with its graph) travel in torch's
  artifacts already; a user kernel recorded anyway is carried twice, which costs only bytes.
Names in the file are `inductor/<xx>/<key>.picked_kernel` and `triton/<folder>/<file>`; restoring never
overwrites what a host has, and writes each Triton folder under a temporary name renamed when complete."""

from __future__ import annotations

import json
import logging
import os
import uuid
from pathlib import Path

log = logging.getLogger(__name__)

PICK_SUFFIX = ".picked_kernel"
INDUCTOR_KERNEL_PREFIX = "triton_"  # Inductor names every kernel it generates so
_loaded_triton_folders: set[str] = set()


def _record_triton_load(module, function, name, metadata_group, hash) -> None:  # noqa: A002 (Triton's names)
    """Triton's kernel-load hook: keep the cache folder of each kernel this process loads."""
    if str(name).startswith(INDUCTOR_KERNEL_PREFIX) or not metadata_group:
        return
    _loaded_triton_folders.add(os.path.dirname(next(iter(metadata_group.values()))))


def record_triton_kernel_loads() -> bool:
    """Start recording the Triton kernels this process loads (Triton's hook chain, or a wrapper around the one
    callable an older Triton keeps; added once). Returns whether Triton is there to record."""
    try:
        from triton import knobs
    except ImportError:
        return False
    hooks = getattr(knobs.runtime, "kernel_load_end_hook", None)
    if hasattr(hooks, "add"):
        hooks.add(_record_triton_load)  # HookChain adds a function once
        return True
    if hasattr(hooks, "replaced_hook"):
        return True

    def chained(*args) -> None:
        if hooks is not None:
            hooks(*args)
        _record_triton_load(*args)

    chained.replaced_hook = hooks  # type: ignore[attr-defined]
    try:
        knobs.runtime.kernel_load_end_hook = chained
    except (AttributeError, TypeError, ValueError):
        return False
    return True


def stop_recording() -> None:
    """Take the hook away again (Triton's hooks are the process's; nothing is recorded once the file is
    written)."""
    try:
        from triton import knobs
    except ImportError:
        return
    hooks = getattr(knobs.runtime, "kernel_load_end_hook", None)
    if hasattr(hooks, "remove"):
        hooks.remove(_record_triton_load)
    elif hasattr(hooks, "replaced_hook"):
        knobs.runtime.kernel_load_end_hook = hooks.replaced_hook


def _inductor_cache_dir() -> Path:
    from torch._inductor.runtime.cache_dir_utils import cache_dir

    return Path(cache_dir())


def _triton_cache_dir() -> Path | None:
    """Triton's cache for kernels compiled outside Inductor (None without Triton)."""
    try:
        from triton import knobs
    except ImportError:
        return None
    folder = getattr(getattr(knobs, "cache", None), "dir", None)
    return Path(folder or os.environ.get("TRITON_CACHE_DIR") or Path.home() / ".triton" / "cache")


def collect() -> dict[str, bytes]:
    """The picks under Inductor's cache and the Triton folders this process loaded, by their names in the file."""
    files: dict[str, bytes] = {}
    for pick in sorted(_inductor_cache_dir().glob(f"*/*{PICK_SUFFIX}")):
        files[f"inductor/{pick.parent.name}/{pick.name}"] = pick.read_bytes()
    for folder in sorted(map(Path, _loaded_triton_folders)):
        if not folder.is_dir():
            continue
        for file in sorted(folder.iterdir()):
            if file.is_file() and file.name != "lock":
                files[f"triton/{folder.name}/{file.name}"] = file.read_bytes()
    return files


def count(names) -> dict[str, int]:
    """How many picks and Triton kernels (folders) `names` hold (summary.json's counts)."""
    names = list(names)
    return {
        "picks": sum(n.startswith("inductor/") for n in names),
        "triton_kernels": len({n.split("/")[1] for n in names if n.startswith("triton/")}),
    }


def _plain(part: str) -> bool:
    return bool(part) and part not in (".", "..") and "/" not in part and "\\" not in part


def restore(files: dict[str, bytes]) -> dict[str, int]:
    """Write `files` (from `collect`) where this host's Inductor and Triton look for them, keeping what is
    there already. Returns how many picks and Triton kernels were written."""
    written = {"picks": 0, "triton_kernels": 0}
    folders: dict[str, dict[str, bytes]] = {}
    for name, data in files.items():
        parts = name.split("/")
        if len(parts) != 3 or not all(map(_plain, parts[1:])):
            log.warning("compile cache: %r is no file this version restores; skipped", name)
        elif parts[0] == "inductor" and parts[2].endswith(PICK_SUFFIX):
            written["picks"] += _write_pick(_inductor_cache_dir() / parts[1] / parts[2], data)
        elif parts[0] == "triton":
            folders.setdefault(parts[1], {})[parts[2]] = data
        else:
            log.warning("compile cache: %r is no file this version restores; skipped", name)
    base = _triton_cache_dir()  # None without Triton: its kernels would serve nothing here
    if base is not None:
        for folder, contents in folders.items():
            written["triton_kernels"] += _write_triton_folder(base, folder, contents)
    return written


def _write_pick(path: Path, data: bytes) -> bool:
    if path.exists():
        return False
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(f".{path.name}.{uuid.uuid4().hex}")
    partial.write_bytes(data)
    os.replace(partial, path)
    return True


def _write_triton_folder(base: Path, folder: str, contents: dict[str, bytes]) -> bool:
    """One Triton cache folder, its `__grp__` files pointing at where the files now lie; a folder already
    holding files is this host's own and kept."""
    target = base / folder
    if target.is_dir() and any(target.iterdir()):
        return False
    base.mkdir(parents=True, exist_ok=True)
    partial = base / f"tmp.compile_cache.{uuid.uuid4().hex}"
    partial.mkdir()
    for name, data in contents.items():
        if name.startswith("__grp__"):
            group = json.loads(data)
            group["child_paths"] = {child: str(target / child) for child in group.get("child_paths", {})}
            data = json.dumps(group).encode()
        (partial / name).write_bytes(data)
    try:
        os.replace(partial, target)  # onto nothing or an empty folder; another process may have won
    except OSError:
        for file in partial.iterdir():
            file.unlink()
        partial.rmdir()
        return False
    return True
