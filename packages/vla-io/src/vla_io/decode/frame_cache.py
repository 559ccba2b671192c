"""An optional cache of decoded frames: uint8 memory-mapped arrays at training resolution.

`FrameCache.build(dataset, size=(224, 224))` decodes every frame of the dataset's video keys once, resizes it
and writes `<cache_dir>/<key>.npy` plus a manifest (written last, so an interrupted build is never used).
`FrameCache.open(...)` checks the manifest against the dataset (episodes, lengths, video file sizes and
modification times) and re-decodes a few random frames to compare them with the cached ones; `attach`
makes the dataset read those keys from the cache instead of decoding.
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

from .._errors import DatasetFormatError
from .._user_cache import dataset_folder, user_cache_dir
from ..augment.torch_backend import resize_uint8

log = logging.getLogger(__name__)
MANIFEST = "manifest.json"
FORMAT = 1


def default_dir(dataset: Any, size: tuple[int, int] | None) -> Path:
    """`user_cache_dir()/frames/<dataset name>-<path hash>/frames-<size>`: never inside the dataset."""
    tag = "source" if size is None else f"{size[0]}x{size[1]}"
    return user_cache_dir() / "frames" / dataset_folder(dataset.root) / f"frames-{tag}"


def _fingerprint(dataset: Any, keys: Sequence[str]) -> dict[str, Any]:
    files = sorted({str(ep.videos[k].path) for ep in dataset._episodes for k in keys})
    return {
        "episodes": [[ep.index, ep.length] for ep in dataset._episodes],
        "files": {f: [os.stat(f).st_size, os.stat(f).st_mtime_ns] for f in files},
    }


class FrameCache:
    """Decoded frames of some video keys, one uint8 (frames, C, h, w) memory map per key."""

    def __init__(self, directory: str | Path, manifest: dict[str, Any]) -> None:
        self.directory = Path(directory)
        self.manifest = manifest
        self._maps: dict[str, np.memmap] = {}
        self._rows: np.ndarray | None = None  # dataset row -> cache row, set by attach

    @property
    def keys(self) -> list[str]:
        """Video keys held in the cache."""
        return list(self.manifest["keys"])

    @property
    def size(self) -> tuple[int, int]:
        """(height, width) of the cached frames."""
        return tuple(self.manifest["shape"][-2:])  # type: ignore[return-value]

    @classmethod
    def build(
        cls, dataset: Any, size: tuple[int, int] | None = None, directory: str | Path | None = None,
        keys: Sequence[str] | None = None, chunk: int = 64, progress: bool = True,
    ) -> FrameCache:  # fmt: skip
        """Decode (and resize to `size`) every frame of `keys` (default: all video keys) into a new cache."""
        from tqdm.auto import tqdm

        keys = list(keys or dataset.video_keys)
        directory = Path(directory or default_dir(dataset, size))
        directory.mkdir(parents=True, exist_ok=True)
        (directory / MANIFEST).unlink(missing_ok=True)
        n = len(dataset)
        maps, shape = {}, None
        bar = tqdm(total=n * len(keys), desc="caching frames", unit="frame", disable=not progress)
        for key in keys:
            for start in range(0, n, chunk):
                rows = np.arange(start, min(n, start + chunk))
                frames = dataset._frames(key, rows[:, None], dataset._table.row_episode[rows], False)[:, 0]
                frames = resize_uint8(frames.cpu(), size) if size else frames.cpu()
                if key not in maps:
                    shape = [n, *frames.shape[1:]]
                    maps[key] = np.lib.format.open_memmap(
                        directory / f"{key}.npy", "w+", np.uint8, tuple(shape)
                    )
                maps[key][rows] = frames.numpy()
                bar.update(len(rows))
            maps[key].flush()
        bar.close()
        manifest = {"format": FORMAT, "keys": keys, "shape": shape, **_fingerprint(dataset, keys)}
        tmp = directory / (MANIFEST + ".tmp")
        tmp.write_text(json.dumps(manifest))
        tmp.replace(directory / MANIFEST)
        cache = cls(directory, manifest)
        cache._rows = np.arange(n)
        return cache

    @classmethod
    def open(
        cls,
        dataset: Any,
        directory: str | Path | None = None,
        size: tuple[int, int] | None = None,
        check_frames: int = 4,
    ) -> FrameCache:
        """Open a cache built for this dataset, validated against the source files and a few decoded frames."""
        directory = Path(directory or default_dir(dataset, size))
        path = directory / MANIFEST
        if not path.exists():
            raise FileNotFoundError(f"{path}: no frame cache here (build it with FrameCache.build)")
        manifest = json.loads(path.read_text())
        if manifest.get("format") != FORMAT:
            raise DatasetFormatError(
                f"{path}: cache format {manifest.get('format')} is not {FORMAT}; rebuild it"
            )
        now = _fingerprint(dataset, manifest["keys"])
        if now["episodes"] != manifest["episodes"]:
            raise DatasetFormatError(f"{path}: built for other episodes than the dataset's; rebuild it")
        changed = [f for f, stamp in now["files"].items() if manifest["files"].get(f) != stamp]
        if changed:
            raise DatasetFormatError(
                f"{path}: source videos changed since the cache was built, e.g. {changed[0]}"
            )
        cache = cls(directory, manifest)
        cache._rows = np.arange(len(dataset))
        cache.verify(dataset, check_frames)
        return cache

    def verify(self, dataset: Any, count: int = 4, seed: int = 0) -> None:
        """Re-decode `count` random frames per key and compare with the cache (at most 1 level apart,
        allowing float rounding differences between machines)."""
        rng = np.random.default_rng(seed)
        for key in self.keys:
            rows = np.sort(rng.choice(len(dataset), size=min(count, len(dataset)), replace=False))
            fresh = dataset._frames(key, rows[:, None], dataset._table.row_episode[rows], False)[:, 0].cpu()
            if tuple(fresh.shape[-2:]) != self.size:
                fresh = resize_uint8(fresh, self.size)
            cached = torch.from_numpy(np.asarray(self._map(key)[rows]))
            diff = (fresh.to(torch.int16) - cached.to(torch.int16)).abs().max().item()
            if diff > 1:
                raise DatasetFormatError(
                    f"{self.directory}: cached frames of {key!r} differ from the source (max {diff} levels at rows "
                    f"{rows.tolist()}); rebuild the cache"
                )

    def attach(self, dataset: Any) -> Any:
        """Make `dataset` read its cached keys from here; returns the dataset."""
        dataset.frame_cache = self
        return dataset

    def covers(self, key: str) -> bool:
        """Whether frames of `key` come from the cache."""
        return key in self.manifest["keys"]

    def _map(self, key: str) -> np.memmap:
        if key not in self._maps:
            self._maps[key] = np.load(self.directory / f"{key}.npy", mmap_mode="r")
        return self._maps[key]

    def read(self, key: str, rows: np.ndarray, allocate: Callable[..., torch.Tensor]) -> torch.Tensor:
        """uint8 (len(rows), C, h, w) frames of dataset `rows`."""
        data = self._map(key)
        out = allocate((len(rows), *data.shape[1:]), torch.device("cpu"))
        out.numpy()[:] = data[self._rows[rows] if self._rows is not None else rows]
        return out

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state["_maps"] = {}  # memory maps are reopened in each process
        return state
