"""Where the frozen prefix's features live: one array per kind, in host memory or in raw files on disk.

`hidden` [K, N, S, D] holds the LLM hidden states after the frozen layers of every sample (N) and
augmentation variant (K) in the stored dtype: bf16 or fp32 as they are, fp8 as e4m3 bytes with one fp32
scale per token (`scale` [K, N, S]: the token's largest magnitude over 448, e4m3's largest value). Prompts
are padded to one length by the processor, so every sample has the same S; the valid-token mask says which
are real. Per sample, whatever the variant: `valid`, `image_mask` [N, S] and the processor's state, action,
action mask, embodiment and episode/frame ids.

On disk a cache is a folder `<fingerprint>/` of raw arrays and `meta.json` (shapes, dtypes, what the
fingerprint was made of); it is written under a temporary name and renamed when complete, so a crash never
leaves a cache that looks usable. Reading maps the files (the page cache holds what fits)."""

from __future__ import annotations

import json
import math
import os
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import torch

META = "meta.json"
FP8_MAX = 448.0
"""The largest finite float8_e4m3fn value: a token's largest magnitude is stored as it."""
STORED = {"bf16": torch.bfloat16, "fp32": torch.float32, "fp8": torch.float8_e4m3fn}
_NUMPY = {1: np.uint8, 2: np.uint16, 4: np.uint32, 8: np.uint64}
"""Raw storage by item size: the arrays are bytes to numpy, torch views them with their real dtype."""


def quantize(hidden: torch.Tensor, dtype: str) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Features [..., D] -> (stored values, fp32 scale per token [...] for fp8, else None)."""
    if dtype != "fp8":
        return hidden.to(STORED[dtype]), None
    wide = hidden.float()
    scale = wide.abs().amax(dim=-1).clamp_min(torch.finfo(torch.float32).tiny) / FP8_MAX
    return (wide / scale[..., None]).to(torch.float8_e4m3fn), scale


def dequantize(stored: torch.Tensor, scale: torch.Tensor | None, dtype: torch.dtype) -> torch.Tensor:
    """The inverse of `quantize`, in the dtype the model computed the features in (graph-safe)."""
    if scale is None:
        return stored.to(dtype)
    return (stored.view(torch.float8_e4m3fn).float() * scale[..., None]).to(dtype)


class FeatureStore:
    """The arrays of one cache (`layout`: name -> (shape, torch dtype name)) and its `meta`."""

    def __init__(self, arrays: dict[str, torch.Tensor], meta: dict[str, Any], folder: Path | None) -> None:
        self.arrays, self.meta, self.folder = arrays, meta, folder

    # ------------------------------------------------------------------------------------ creating
    @classmethod
    def create(cls, meta: dict[str, Any], folder: Path | None) -> FeatureStore:
        """Empty arrays for `meta["layout"]`: in host memory (folder None) or as files in `folder` (a
        temporary folder that `finish` renames)."""
        arrays = {}
        if folder is not None:
            folder.mkdir(parents=True)
        for name, (shape, dtype) in meta["layout"].items():
            torch_dtype = getattr(torch, dtype)
            if folder is None:
                arrays[name] = torch.empty(shape, dtype=torch_dtype)
            else:
                arrays[name] = _mapped(folder / f"{name}.bin", shape, torch_dtype, "w+")
        return cls(arrays, meta, folder)

    def write(self, name: str, rows: torch.Tensor, values: torch.Tensor, variant: int | None = None) -> None:
        """Store `values` (any device) at sample indices `rows` (of `variant` for per-variant arrays)."""
        target = self.arrays[name] if variant is None else self.arrays[name][variant]
        target[rows] = values.detach().to("cpu").view(target.dtype)

    def flush(self) -> None:
        """Write this process's changes of mapped files through (other processes read the same pages)."""
        for array in self.arrays.values():
            if hasattr(array, "_mmap"):
                array._mmap.flush()

    def finish(self, final: Path | None) -> FeatureStore:
        """Complete the cache: on disk, flush the files, write meta.json and move the folder to `final`."""
        if self.folder is None or final is None:
            return self
        self.flush()
        (self.folder / META).write_text(json.dumps(self.meta, indent=1, sort_keys=True) + "\n")
        for path in self.folder.iterdir():
            fd = os.open(path, os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
        if (FeatureStore.read_meta(final) or {}).get("fingerprint") == self.meta["fingerprint"]:
            shutil.rmtree(self.folder)  # another run finished the same cache first: use theirs
            return FeatureStore.open(final)
        if final.exists():  # an incomplete or unreadable one: replaced
            shutil.rmtree(final)
        os.replace(self.folder, final)
        return FeatureStore.open(final)

    # ------------------------------------------------------------------------------------- reading
    @classmethod
    def open(cls, folder: Path, meta: dict[str, Any] | None = None, writable: bool = False) -> FeatureStore:
        """A cache folder's files mapped: read-only (a complete cache, its meta.json read), or for writing
        (the files another process created for `meta`)."""
        meta = meta or json.loads((folder / META).read_text())
        arrays = {
            name: _mapped(folder / f"{name}.bin", shape, getattr(torch, dtype), "r+" if writable else "r")
            for name, (shape, dtype) in meta["layout"].items()
        }
        return cls(arrays, meta, folder)

    @staticmethod
    def read_meta(folder: Path) -> dict[str, Any] | None:
        """A cache folder's meta.json, or None when there is none (or it cannot be read)."""
        try:
            return json.loads((folder / META).read_text())
        except (OSError, ValueError):
            return None

    def nbytes(self) -> int:
        """Bytes the arrays take."""
        return sum(a.numel() * a.element_size() for a in self.arrays.values())


def remove_abandoned(folder: Path, stem: str) -> list[Path]:
    """Remove `folder`'s temporary build folders `.tmp-<stem>-<pid>` whose process is gone (a build cut
    short); returns them."""
    removed = []
    for path in folder.glob(f".tmp-{stem}-*") if folder.is_dir() else []:
        try:
            os.kill(int(path.name.rsplit("-", 1)[1]), 0)
            continue  # its process still runs (perhaps building right now)
        except ProcessLookupError:
            pass
        except (ValueError, PermissionError):
            continue  # not ours to judge
        shutil.rmtree(path, ignore_errors=True)
        removed.append(path)
    return removed


def _mapped(path: Path, shape: list[int], dtype: torch.dtype, mode: str) -> torch.Tensor:
    """A file as a tensor of `shape` and `dtype` (mapped: reads and writes go through the page cache)."""
    itemsize = torch.empty((), dtype=dtype).element_size()
    count = math.prod(shape)
    if count == 0:
        return torch.empty(shape, dtype=dtype)
    if mode == "r":
        mode = "c"  # copy-on-write: a writable view for torch, nothing ever written back
    array = np.memmap(path, dtype=_NUMPY[itemsize], mode=mode, shape=(count,))
    tensor = torch.from_numpy(array).view(dtype).view(shape)
    tensor._mmap = array  # keeps the mapping alive with the tensor, for flush()
    return tensor
