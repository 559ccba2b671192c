"""`optimizations.compile_cache`: torch.compile's work kept in one file, so a fresh host starts warm.

torch.compile keeps what it compiled (FX graphs, AOTAutograd entries, Triton kernels, autotuning results) in
caches under /tmp, which a fresh cloud host or container does not have: every run there starts cold. torch's
cache artifacts (`torch.compiler.save_cache_artifacts` / `load_cache_artifacts`) carry those entries in one
blob. A run with the setting loads the file before its first compile when it exists, and otherwise writes it
once its first step has compiled. Entries hold only where torch, Triton, the GPU and the compiled graphs are
the same; anything else compiles as it would have."""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from pathlib import Path

import torch

log = logging.getLogger(__name__)


@dataclass
class CompileCache:
    """The file and what this run did with it (summary.json's `compile_cache`)."""

    path: Path
    loaded_bytes: int = 0
    """Size of the file loaded before compiling (0: none loaded)."""
    saved_bytes: int = 0
    """Size of the file this run wrote (0: none written)."""

    @classmethod
    def open(cls, path: str | os.PathLike) -> CompileCache:
        """Load `path` into torch.compile's local caches if it exists (before anything compiles). A file
        torch cannot read is named in a warning; the run compiles without it and writes it anew."""
        cache = cls(Path(path).expanduser())
        if not cache.path.is_file():
            log.info(
                "compile cache %s does not exist yet: written once the first step has compiled", cache.path
            )
            return cache
        data = cache.path.read_bytes()
        try:  # torch logs a damaged blob and returns None; other torch versions may raise
            info = torch.compiler.load_cache_artifacts(data)
        except Exception as err:
            info, why = None, f" ({type(err).__name__}: {err})"
        else:
            why = ""
        if info is None:
            log.warning("compile cache %s could not be loaded%s: compiling without it", cache.path, why)
            return cache
        cache.loaded_bytes = len(data)
        log.info("compile cache %s loaded (%.1f MB; %s)", cache.path, len(data) / 1e6, _count(info))
        return cache

    def save(self) -> None:
        """Write what this process compiled, if the file was not loaded: to a temporary name, then renamed, so a
        crash or another run writing the same path never leaves a partial file."""
        if self.loaded_bytes:
            return
        artifacts = torch.compiler.save_cache_artifacts()
        if artifacts is None:
            log.warning("compile cache %s: torch.compile recorded nothing to save", self.path)
            return
        data, info = artifacts
        self.path.parent.mkdir(parents=True, exist_ok=True)
        partial = self.path.with_name(f".{self.path.name}.{os.getpid()}.partial")
        try:
            partial.write_bytes(data)
            os.replace(partial, self.path)
        except OSError as err:
            partial.unlink(missing_ok=True)
            log.warning("compile cache %s could not be written: %s", self.path, err)
            return
        self.saved_bytes = len(data)
        log.info("compile cache %s written (%.1f MB; %s)", self.path, len(data) / 1e6, _count(info))

    def facts(self) -> dict:
        return {"path": str(self.path), "loaded_bytes": self.loaded_bytes, "saved_bytes": self.saved_bytes}


def _count(info) -> str:
    artifacts = getattr(info, "artifacts", None) or {}
    return ", ".join(f"{len(keys)} {kind}" for kind, keys in artifacts.items()) or "no entries"
