"""`optimizations.compile_cache`: torch.compile's work kept in one file, so a fresh host starts warm.

torch.compile keeps what it compiled (FX graphs, AOTAutograd entries, Triton kernels, autotuning results) in
caches under /tmp, which a fresh cloud host or container does not have: every run there starts cold. torch's
cache artifacts (`torch.compiler.save_cache_artifacts` / `load_cache_artifacts`) carry those entries in one
blob; `compile_cache_files` adds what they leave out (Inductor's multi-kernel picks, our own Triton kernels).
The file is a zip of `torch.bin` (the artifacts) and those files; a file of the artifacts alone (as written
before) loads too. A run loads the file (by default `<output_dir>/compile_cache.bin`, where a resumed run
finds it) before its first compile when it exists, and writes it once its first step has compiled unless it
loaded it and compiled nothing anew. Entries hold only where torch, Triton, the GPU and the compiled graphs
are the same; anything else compiles as it would have."""

from __future__ import annotations

import io
import logging
import os
import zipfile
from dataclasses import dataclass, field
from pathlib import Path

import torch

from ..metrics.startup import compile_cache_counts
from . import compile_cache_files

ARTIFACTS = "torch.bin"
AUTO_FILE = "compile_cache.bin"
"""`optimizations.compile_cache=auto`: this file in the run's output_dir."""
log = logging.getLogger(__name__)


@dataclass
class CompileCache:
    """The file and what this run did with it (summary.json's `compile_cache`)."""

    path: Path
    loaded_bytes: int = 0
    """Size of the file loaded before compiling (0: none loaded)."""
    saved_bytes: int = 0
    """Size of the file this run wrote (0: none written)."""
    files: dict[str, int] = field(default_factory=dict)
    """Multi-kernel picks and Triton kernels the file carried that this host lacked (loaded), or that this run
    wrote into it (saved)."""

    @staticmethod
    def path_for(setting: str, output_dir: str | os.PathLike) -> Path | None:
        """The file `optimizations.compile_cache` names for a run writing to `output_dir` (None: not used)."""
        if setting in ("", "off"):
            return None
        return Path(output_dir) / AUTO_FILE if setting == "auto" else Path(setting)

    @classmethod
    def open(cls, path: str | os.PathLike) -> CompileCache:
        """Load `path` into torch.compile's local caches if it exists (before anything compiles). A file
        torch cannot read is named in a warning; the run compiles without it and writes it anew."""
        cache = cls(Path(path).expanduser())
        compile_cache_files.record_triton_kernel_loads()  # what the first step loads, should it write the file
        if not cache.path.is_file():
            log.info(
                "compile cache %s does not exist yet: written once the first step has compiled", cache.path
            )
            return cache
        data, extra = _read(cache.path)
        try:  # torch logs a damaged blob and returns None; other torch versions may raise
            info = torch.compiler.load_cache_artifacts(data)
        except Exception as err:
            info, why = None, f" ({type(err).__name__}: {err})"
        else:
            why = ""
        if info is None:
            log.warning("compile cache %s could not be loaded%s: compiling without it", cache.path, why)
            return cache
        cache.loaded_bytes = cache.path.stat().st_size
        cache.files = compile_cache_files.restore(extra)
        cache._say("loaded", cache.loaded_bytes, info, "written here: ")
        return cache

    def after_first_step(self, write: bool) -> None:
        """Once the first step has compiled: the main rank (`write`) writes the file; every rank stops
        recording Triton's kernel loads."""
        if write:
            self.save()
        else:
            compile_cache_files.stop_recording()

    def save(self) -> None:
        """Write what this process compiled, unless the file was loaded and nothing compiled anew (a file from
        another GPU or torch is replaced by this host's): to a temporary name, then renamed, so a crash or
        another run writing the same path never leaves a partial file."""
        compile_cache_files.stop_recording()  # the kernels of the first step are what it carries
        if self.loaded_bytes and not _compiled_anew():
            return
        artifacts = torch.compiler.save_cache_artifacts()
        if artifacts is None:
            log.warning("compile cache %s: torch.compile recorded nothing to save", self.path)
            return
        data, info = artifacts
        extra = compile_cache_files.collect()
        self.path.parent.mkdir(parents=True, exist_ok=True)
        partial = self.path.with_name(f".{self.path.name}.{os.getpid()}.partial")
        try:
            with zipfile.ZipFile(partial, "w", zipfile.ZIP_STORED) as archive:
                archive.writestr(ARTIFACTS, data)
                for name, contents in extra.items():
                    archive.writestr(name, contents)
            os.replace(partial, self.path)
        except OSError as err:
            partial.unlink(missing_ok=True)
            log.warning("compile cache %s could not be written: %s", self.path, err)
            return
        self.saved_bytes = self.path.stat().st_size
        self.files = compile_cache_files.count(extra)
        self._say("written", self.saved_bytes, info)

    def _say(self, done: str, size: int, info, files_are: str = "") -> None:
        artifacts = getattr(info, "artifacts", None) or {}
        entries = ", ".join(f"{len(keys)} {kind}" for kind, keys in artifacts.items()) or "no entries"
        files = ", ".join(f"{n} {kind.replace('_', ' ')}" for kind, n in self.files.items())
        log.info(
            "compile cache %s %s (%.1f MB; %s; %s%s)", self.path, done, size / 1e6, entries, files_are, files
        )

    def facts(self) -> dict:
        return {
            "path": str(self.path),
            "loaded_bytes": self.loaded_bytes,
            "saved_bytes": self.saved_bytes,
            "files": self.files,
        }


def _compiled_anew() -> bool:
    """Whether this process compiled a graph its caches did not hold (FX graph or AOTAutograd misses)."""
    counts = compile_cache_counts()
    return bool(counts.get("fx_graph_miss") or counts.get("aot_autograd_miss"))


def _read(path: Path) -> tuple[bytes, dict[str, bytes]]:
    """torch's artifacts and the other files, from a zip of them or a file of the artifacts alone."""
    data = path.read_bytes()
    if not zipfile.is_zipfile(io.BytesIO(data)):
        return data, {}
    try:
        with zipfile.ZipFile(io.BytesIO(data)) as archive:
            files = {name: archive.read(name) for name in archive.namelist()}
    except (zipfile.BadZipFile, OSError, EOFError):
        return data, {}  # torch then names the file as not loadable
    if ARTIFACTS not in files:
        return data, {}
    return files.pop(ARTIFACTS), files
