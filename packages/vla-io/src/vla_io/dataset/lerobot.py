"""`LeRobotDataset`: LeRobot v2.x / v3.0 datasets from disk, with LeRobot's sample conventions."""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

from .._errors import DatasetFormatError
from ..decode.ffmpeg import resolve_backend
from ..decode.frames import FrameFetcher, FrameRequest
from ..decode.readers import BACKENDS, ReaderCache
from ..decode.sizes import camera_sizes
from ..pipeline.shm import shared_empty, to_shared
from .file_groups import file_group_keys
from .meta import DatasetMeta, Episode
from .table import FrameTable, index_ranges, unknown_task_reason, unknown_task_rows

log = logging.getLogger(__name__)
IMAGE_DTYPES = ("float32", "uint8")
FRAME_TIMES = ("index", "timestamp")


class LeRobotDataset:
    """A LeRobot dataset on disk: `len(ds)` frames, `ds[i]` a dict keyed by feature name.

    Images come as float32 (C, H, W) in [0, 1] (or uint8 with `image_dtype="uint8"`); a key listed in
    `delta_timestamps` gets a leading time axis and a `<key>_is_pad` mask for times outside the episode
    (clamped to the episode's edge, as LeRobot does); `task` is the frame's task text. `ds.meta` holds fps,
    features, episodes, tasks, stats and the optional `modality` (named slices of state/action vectors).
    Declared video features with no files on disk are skipped unless named in `video_keys`.

    `get_batch(indices)` returns the collated batch and decodes the frames of each video file in one sorted
    request: this is what pipeline workers call. Video frame times are `frame_index / fps` within the episode
    (`frame_time="index"`; robust to datasets whose `timestamp` column is shifted) or the parquet
    `timestamp` column (`frame_time="timestamp"`, LeRobot's rule); the decoder's returned time must match
    within `tolerance_s`.
    """

    def __init__(
        self,
        root: str | Path,
        *,
        episodes: Sequence[int] | None = None,
        delta_timestamps: Mapping[str, Sequence[float]] | None = None,
        video_keys: Sequence[str] | None = None,
        image_dtype: str = "float32",
        video_backend: str = "auto",
        decode_device: str = "cpu",
        seek_mode: str = "exact",
        frame_time: str = "index",
        tolerance_s: float = 1e-4,
        strict: bool = True,
        max_open_videos: int = 256,
        progress: bool = True,
    ) -> None:
        _check_choice("image_dtype", image_dtype, IMAGE_DTYPES)
        _check_choice("video_backend", video_backend, BACKENDS)
        _check_choice("seek_mode", seek_mode, ("exact", "approximate"))
        _check_choice("frame_time", frame_time, FRAME_TIMES)
        if tolerance_s <= 0 or max_open_videos < 1:
            raise ValueError("tolerance_s must be > 0 and max_open_videos >= 1")
        self.root = Path(root)
        self.meta = DatasetMeta(self.root)
        _warn_unindexed(self.meta)
        self.image_dtype, self.frame_time, self.tolerance_s = image_dtype, frame_time, tolerance_s
        self.decode_device = decode_device
        self._episodes = self._select_episodes(episodes)
        self.video_keys = self._resolve_video_keys(video_keys)
        self._table = FrameTable(self.meta, self._episodes, strict=strict, progress=progress)
        self._check_task_indices(strict)
        self.delta_timestamps = self._check_deltas(delta_timestamps or {})
        self._delta_indices = {
            k: np.rint(np.asarray(v, dtype=np.float64) * self.fps).astype(np.int64)
            for k, v in self.delta_timestamps.items()
        }
        if decode_device != "cpu" and video_backend == "pyav":
            raise ValueError(f"decode_device={decode_device!r} needs video_backend 'torchcodec' or 'auto'")
        # resolved once here (one warning if "auto" falls back to PyAV), workers inherit the result
        self.video_backend = resolve_backend("torchcodec" if decode_device != "cpu" else video_backend)
        readers = ReaderCache(
            max_open_videos, backend=self.video_backend, device=decode_device, seek_mode=seek_mode
        )
        sizes = camera_sizes(self.meta, self._episodes, self.video_keys, self.video_backend)
        self._fetcher = FrameFetcher(readers, self.fps, tolerance_s, strict, sizes)
        self.frame_cache: Any = None  # a FrameCache, set by FrameCache.attach
        self._file_groups = file_group_keys(self._episodes, self.video_keys)  # routing keys, see affinity

    # -- LeRobot-style properties -------------------------------------------------------------------
    @property
    def fps(self) -> float:
        """Frames per second of the dataset."""
        return self.meta.fps

    @property
    def features(self) -> dict[str, dict[str, Any]]:
        """Feature declarations of `meta/info.json`."""
        return self.meta.features

    @property
    def num_frames(self) -> int:
        """Frames (samples) in the selected episodes."""
        return len(self._table)

    @property
    def num_episodes(self) -> int:
        """Number of selected episodes."""
        return len(self._episodes)

    @property
    def episode_indices(self) -> list[int]:
        """`episode_index` of every selected episode, in order."""
        return [e.index for e in self._episodes]

    def affinity(self, indices: Sequence[int] | np.ndarray) -> np.ndarray:
        """A key per sample for routing work: the video files it reads (v2.x: its episode's own files;
        v3.0: the files many episodes share, so that each file is read by one worker, not by all)."""
        return self._file_groups[self._table.row_episode[np.asarray(indices, dtype=np.int64)]]

    def prefers_affinity(self) -> bool:
        """True when the dataset has more video files than one worker keeps open (`max_open_videos`):
        then routing samples to workers by episode keeps each worker's decoders warm."""
        files = {str(ep.videos[k].path) for ep in self._episodes for k in self.video_keys}
        return len(files) > self._fetcher.readers.max_open

    def sample_location(self, index: int) -> tuple[int, int]:
        """(episode_index, frame within the episode) of sample `index`, for messages about one sample."""
        pos = int(self._table.row_episode[index])
        return self._episodes[pos].index, int(index - self._table.starts[pos])

    def episode_bounds(self) -> np.ndarray:
        """(num_episodes, 2) array of [start, end) sample indices of each selected episode."""
        return np.stack([self._table.starts, self._table.ends], axis=1)

    def __len__(self) -> int:
        return len(self._table)

    def __repr__(self) -> str:
        return (
            f"LeRobotDataset({str(self.root)!r}, {self.meta.version}, frames={len(self)}, "
            f"episodes={self.num_episodes}, videos={self.video_keys}, deltas={sorted(self.delta_timestamps)})"
        )

    # -- samples --------------------------------------------------------------------------------------
    def __getitem__(self, index: int) -> dict[str, Any]:
        batch = self.get_batch([int(index)])
        return {k: v[0] for k, v in batch.items()}

    def get_batch(
        self,
        indices: Sequence[int] | np.ndarray,
        *,
        image_dtype: str | None = None,
        shared_memory: bool = False,
    ) -> dict[str, Any]:
        """The collated samples at `indices`: tensors with a leading batch axis, `task` a list of str.

        `shared_memory=True` allocates the tensors in shared memory (for handing them to another process).
        """
        rows = np.asarray(indices, dtype=np.int64).reshape(-1)
        if len(rows) and (rows.min() < 0 or rows.max() >= len(self)):
            raise IndexError(f"{self.root}: sample index out of range [0, {len(self)}): {rows.tolist()[:8]}")
        image_dtype = image_dtype or self.image_dtype
        pos = self._table.row_episode[rows]
        start, end = self._table.starts[pos], self._table.ends[pos]
        out: dict[str, Any] = {}
        for key, column in self._table.columns.items():
            if key in self._delta_indices:
                q, pad = _window(rows, start, end, self._delta_indices[key])
                out[key], out[f"{key}_is_pad"] = column[q], pad
            else:
                out[key] = column[rows]
        for key in self.video_keys:
            q, pad = (
                _window(rows, start, end, self._delta_indices[key])
                if key in self._delta_indices
                else (rows[:, None], None)
            )
            frames = self._frames(key, q, pos, shared_memory)
            out[key] = frames if pad is not None else frames[:, 0]
            if pad is not None:
                out[f"{key}_is_pad"] = pad
        task_index = self._table.columns.get("task_index")
        if task_index is not None:
            out["task"] = [self.meta.tasks.get(int(t)) for t in task_index[rows]]
            if None in out["task"]:  # strict=False lets such rows through construction, not into a batch
                raise self._unknown_task_error(int(rows[out["task"].index(None)]))
        else:
            out["task"] = [(self._episodes[p].tasks or [""])[0] for p in pos]
        return _to_torch(out, image_dtype, self.video_keys, shared_memory)

    def _frames(self, key: str, q: np.ndarray, pos: np.ndarray, shared: bool) -> torch.Tensor:
        """uint8 (B, T, C, H, W) frames of camera `key` at dataset rows `q` (B, T)."""
        b, t = q.shape
        ep_pos = np.repeat(pos, t)
        within = (q.reshape(-1) - self._table.starts[ep_pos]).astype(np.float64)
        if self.frame_time == "timestamp":
            times = self._table.columns["timestamp"][q.reshape(-1)].astype(np.float64)
        else:
            times = within / self.fps
        episodes = [self._episodes[p] for p in ep_pos]

        def allocate(shape: tuple[int, ...], device: torch.device) -> torch.Tensor:
            if shared and device.type == "cpu":
                return shared_empty(shape, torch.uint8)
            return torch.empty(shape, dtype=torch.uint8, device=device)

        if self.frame_cache is not None and self.frame_cache.covers(key):
            frames = self.frame_cache.read(key, q.reshape(-1), allocate)
        else:
            frames = self._fetcher.fetch(FrameRequest(key, episodes, times), allocate)
        return frames.view(b, t, *frames.shape[1:])

    # -- construction helpers -------------------------------------------------------------------------
    def _check_task_indices(self, strict: bool) -> None:
        """Rows whose task_index names no task would train on an empty prompt: an error (a warning with
        strict=False; those samples then fail when read) naming data file, episode, frames and values."""
        task_index = self._table.columns.get("task_index")
        bad = unknown_task_rows(self.meta, task_index) if task_index is not None else []
        if not len(bad):
            return
        positions = self._table.row_episode[bad]
        parts = []
        for pos in np.unique(positions)[:4]:
            ep, rows = self._episodes[pos], bad[positions == pos]
            frames = index_ranges(rows - self._table.starts[pos])
            reason = unknown_task_reason(self.meta, task_index[rows])
            parts.append(f"{ep.data_path}: episode {ep.index}, frames {frames}: {reason}")
        more = len(np.unique(positions)) - len(parts)
        text = (
            f"{self.root}: {len(bad)} row(s) have a task_index that names no task: " + "; ".join(parts)
            + (f"; and {more} more episode(s)" if more > 0 else "")
            + ". `vla-io check` lists every row"
        )  # fmt: skip
        if strict:
            raise DatasetFormatError(text + "; strict=False only fails the samples of those rows when read")
        log.warning("%s; reading those samples will fail", text)

    def _unknown_task_error(self, row: int) -> DatasetFormatError:
        episode, frame = self.sample_location(row)
        value = int(self._table.columns["task_index"][row])
        path = self._episodes[int(self._table.row_episode[row])].data_path
        reason = unknown_task_reason(self.meta, [value])
        return DatasetFormatError(f"{path}: episode {episode}, frame {frame}: {reason}")

    def _select_episodes(self, episodes: Sequence[int] | None) -> list[Episode]:
        known = {e.index: e for e in self.meta.episodes}
        unknown = [e for e in episodes if e not in known] if episodes is not None else []
        if unknown:
            raise KeyError(
                f"{self.root}: unknown episodes {unknown[:8]} (the dataset has {len(known)} episodes)"
            )
        chosen = list(self.meta.episodes) if episodes is None else [known[e] for e in sorted(set(episodes))]
        empty = [e for e in chosen if e.length == 0]
        if empty:  # no sample can come from them; left in, their files would still be read
            shown = ", ".join(f"{e.index} ({e.data_path.relative_to(self.root)})" for e in empty[:8])
            log.warning(
                "%s: %d episode(s) have no frames (length 0 in the episodes index) and are skipped: %s%s",
                self.root, len(empty), shown, " ..." if len(empty) > 8 else "",
            )  # fmt: skip
        return [e for e in chosen if e.length > 0]

    def _resolve_video_keys(self, requested: Sequence[str] | None) -> list[str]:
        declared = self.meta.video_keys
        if requested is not None:
            unknown = [k for k in requested if k not in declared]
            if unknown:
                raise KeyError(
                    f"{self.root}: unknown video keys {unknown}; declared video features: {declared}"
                )
            for key in requested:
                for ep in self._episodes:
                    span = ep.videos.get(key)
                    if span is None or not span.path.exists():
                        where = span.path if span else "(no file recorded in the episode metadata)"
                        raise FileNotFoundError(
                            f"{where}: video of episode {ep.index}, key {key!r} not found"
                        )
            return list(requested)
        keys = []
        for key in declared:
            missing = [
                ep for ep in self._episodes if key not in ep.videos or not ep.videos[key].path.exists()
            ]
            if len(missing) == len(self._episodes):
                log.info("%s: ignoring declared video feature %r: no files on disk", self.root, key)
                continue
            if missing:
                ep = missing[0]
                where = ep.videos[key].path if key in ep.videos else "(no file recorded)"
                raise FileNotFoundError(f"{where}: video of episode {ep.index}, key {key!r} not found")
            keys.append(key)
        return keys

    def _check_deltas(self, deltas: Mapping[str, Sequence[float]]) -> dict[str, list[float]]:
        known = set(self._table.columns) | set(self.video_keys)
        checked = {}
        for key, values in deltas.items():
            if key not in known:
                raise KeyError(
                    f"{self.root}: delta_timestamps key {key!r} is not a feature; known: {sorted(known)}"
                )
            values = [float(v) for v in values]
            if not values:
                raise ValueError(f"delta_timestamps[{key!r}] is empty")
            for v in values:
                if abs(v * self.fps - round(v * self.fps)) > self.tolerance_s * self.fps:
                    raise ValueError(
                        f"delta_timestamps[{key!r}]: {v} s is not a multiple of 1/fps = {1 / self.fps:g} s "
                        f"(tolerance {self.tolerance_s} s)"
                    )
            checked[key] = values
        return checked


def _warn_unindexed(meta: DatasetMeta) -> None:
    from .index_check import unindexed_episodes

    found = unindexed_episodes(meta)
    if found:
        shown = ", ".join(f"{e} ({p.name})" for p, e in found[:8]) + (" ..." if len(found) > 8 else "")
        log.warning(
            "%s: %d episode(s) have data files but are missing from the episodes index (meta/), so they are "
            "ignored: %s. `vla-io check` lists every problem of the dataset",
            meta.root,
            len(found),
            shown,
        )


def _check_choice(name: str, value: str, allowed: Sequence[str]) -> None:
    if value not in allowed:
        raise ValueError(f"{name} must be one of {tuple(allowed)}, got {value!r}")


def _window(rows: np.ndarray, start: np.ndarray, end: np.ndarray, deltas: np.ndarray):
    """Rows at `rows + deltas`, clamped to each row's episode, and the mask of clamped positions."""
    q = rows[:, None] + deltas[None, :]
    pad = (q < start[:, None]) | (q >= end[:, None])
    return np.clip(q, start[:, None], end[:, None] - 1), pad


def _to_torch(batch: dict[str, Any], image_dtype: str, video_keys: list[str], shared: bool) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in batch.items():
        if isinstance(value, torch.Tensor):
            if key in video_keys and image_dtype == "float32":
                value = value.to(torch.float32).div_(255.0)
                value = to_shared(value) if shared and value.device.type == "cpu" else value
            out[key] = value
        elif isinstance(value, np.ndarray) and value.dtype != object:
            tensor = torch.from_numpy(np.ascontiguousarray(value))
            out[key] = to_shared(tensor) if shared else tensor
        elif isinstance(value, np.ndarray):
            out[key] = value.tolist()
        else:
            out[key] = value
    return out
