"""Statistics of numeric features for normalization: the dataset's own where complete, else computed once
from its rows and cached in the user cache folder (never written into the dataset)."""

from __future__ import annotations

import hashlib
import json
import logging
import os
import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from .._user_cache import ENV, dataset_folder, user_cache_dir, write_json_atomic
from .stats import Stats, feature_stats, stats_from_json, stats_to_json

log = logging.getLogger(__name__)
NEEDED = ("mean", "std", "min", "max")
"""What a feature's statistics must hold to be used as they are."""


def dataset_stats(
    dataset: Any, keys: Sequence[str], *, cache_dir: str | Path | None = None
) -> dict[str, dict[str, np.ndarray]]:
    """{key: {mean, std, min, max, ...}} for numeric features `keys` of a `LeRobotDataset`.

    A feature's statistics come from the dataset's metadata (`meta/stats.json`, or v2.1's per-episode
    statistics combined) when they hold mean, std, min and max of the feature's width. Otherwise they are
    computed from the dataset's rows (min, max, mean, std, q01, q99) and cached under `cache_dir` (default
    `user_cache_dir()/stats`), keyed by the dataset's path, metadata, data files and selected episodes, so
    the next run reads them back. Nothing is written into the dataset folder. When the cache cannot be
    written (a read-only folder, a file in its place), the statistics are returned all the same, with one
    `RuntimeWarning` per folder that names it and how to move it.
    """
    columns = dataset._table.columns
    own = dataset.meta.stats or {}
    out: Stats = {}
    missing = []
    for key in keys:
        if key not in columns:
            raise KeyError(
                f"{dataset.root}: no feature {key!r} in the data files (they have {sorted(columns)})"
            )
        width = _width(columns[key])
        if _complete(own.get(key), width):
            out[key] = own[key]
        else:
            missing.append(key)
    if not missing:
        return out
    path = stats_cache_path(dataset, cache_dir)
    cached = _read(path)
    new = [k for k in missing if not _complete(cached.get(k), _width(columns[k]))]
    for key in new:
        values = np.asarray(columns[key], dtype=np.float64)
        cached[key] = feature_stats(values.reshape(len(values), -1))
    if new:
        try:
            write_json_atomic(path, stats_to_json(cached))
        except OSError as err:
            how = "pass a writable cache_dir" if cache_dir is not None else f"set {ENV} to a writable folder"
            _warn_not_cached(str(path.parent), f"{type(err).__name__}: {err}", how)
        else:
            log.info("computed statistics of %s from %d rows; cached in %s", new, len(dataset), path)
    else:
        log.info("statistics of %s read from the cache %s", missing, path)
    out.update({k: cached[k] for k in missing})
    return out


def stats_cache_path(dataset: Any, cache_dir: str | Path | None = None) -> Path:
    """The cache file of a dataset's computed statistics (changes when its data files change)."""
    base = Path(cache_dir) if cache_dir is not None else user_cache_dir() / "stats"
    return base / f"{dataset_folder(dataset.root)}-{_fingerprint(dataset)}.json"


def _fingerprint(dataset: Any) -> str:
    """A hash of what the statistics depend on: metadata, the data files' sizes and times, the episodes."""
    digest = hashlib.sha256((Path(dataset.root) / "meta" / "info.json").read_bytes())
    files = sorted({str(e.data_path) for e in dataset._episodes})
    stamps = [[f, os.stat(f).st_size, os.stat(f).st_mtime_ns] for f in files]
    digest.update(json.dumps([stamps, dataset.episode_indices]).encode())
    return digest.hexdigest()[:16]


def _width(column: np.ndarray) -> int:
    return int(np.prod(column.shape[1:], dtype=np.int64)) if column.ndim > 1 else 1


def _complete(stats: dict[str, Any] | None, width: int) -> bool:
    return stats is not None and all(
        name in stats and np.asarray(stats[name]).size == width for name in NEEDED
    )


_WARNED: set[str] = set()  # cache folders already warned about in this process


def _warn_not_cached(folder: str, cause: str, how: str) -> None:
    """Once per folder and process: training goes on, but every run pays for the statistics again."""
    if folder in _WARNED:
        return
    _WARNED.add(folder)
    warnings.warn(
        f"vla-io: computed dataset statistics but could not cache them in {folder} ({cause}); they are "
        f"used all the same and will be computed again next time. To cache them, {how}.",
        RuntimeWarning,
        stacklevel=3,
    )


def _read(path: Path) -> Stats:
    try:
        return stats_from_json(json.loads(path.read_text()))
    except (OSError, ValueError):  # absent or unreadable: computed again and rewritten
        return {}
