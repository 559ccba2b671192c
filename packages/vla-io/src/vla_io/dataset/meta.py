"""Metadata of a LeRobot dataset on disk (v2.0, v2.1 and v3.0 layouts)."""

from __future__ import annotations

import json
import logging
import math
from collections.abc import Collection, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq

from .._errors import DatasetFormatError
from .modality import Modality
from .parquet_file import read_parquet
from .stats import Stats, aggregate_stats, stats_from_json

log = logging.getLogger(__name__)

SUPPORTED = ("v2.0", "v2.1", "v3.0")


@dataclass(frozen=True)
class VideoSpan:
    """Where one episode of one camera lives: a file, and the time of the episode's first frame in it."""

    path: Path
    from_timestamp: float = 0.0


@dataclass
class Episode:
    """One episode: its index, length, tasks, data file and the video span of each camera."""

    index: int
    length: int
    tasks: list[str]
    data_path: Path
    videos: dict[str, VideoSpan] = field(default_factory=dict)
    dataset_from_index: int | None = None
    """v3.0: first global `index` of the episode (its row range in the data files)."""


def _read_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text())
    except FileNotFoundError:
        raise DatasetFormatError(f"{path}: file not found (is this a LeRobot dataset root?)") from None
    except (OSError, json.JSONDecodeError) as err:
        raise DatasetFormatError(f"{path}: cannot read JSON ({err})") from err


def _read_jsonl(path: Path) -> list[dict[str, Any]]:
    rows = []
    try:
        lines = path.read_text().splitlines()
    except FileNotFoundError:
        raise DatasetFormatError(f"{path}: file not found") from None
    for number, line in enumerate(lines, 1):
        if line.strip():
            try:
                rows.append(json.loads(line))
            except json.JSONDecodeError as err:
                raise DatasetFormatError(f"{path}:{number}: bad JSON line ({err})") from err
    return rows


def _read_parquet(path: Path, columns: Collection[str] | None = None) -> dict[str, list]:
    """The file's columns as lists: all of them, or those of `columns` that it has."""
    try:
        if columns is not None:
            columns = [name for name in pq.read_schema(path).names if name in columns]
        return read_parquet(path, columns).to_pydict()
    except FileNotFoundError:
        raise DatasetFormatError(f"{path}: file not found") from None
    except Exception as err:  # pyarrow raises several types for corrupt files
        raise DatasetFormatError(f"{path}: cannot read parquet ({err})") from err


def _positive_number(
    info: Mapping[str, Any], name: str, path: Path, *, default: float | None = None, integer: bool = False
) -> float:
    """`info[name]`, checked to be a finite number > 0 (whole with `integer`): the reader divides by it, so
    0, a negative number, NaN or a string would otherwise fail later as a ZeroDivisionError or worse."""
    value = info.get(name, default)
    valid = (
        isinstance(value, (int, float))
        and not isinstance(value, bool)
        and math.isfinite(value)
        and value > 0
        and (not integer or float(value).is_integer())
    )
    if not valid:
        kind = "a positive whole number" if integer else "a positive number"
        raise DatasetFormatError(f"{path}: field {name!r} must be {kind}, got {value!r}")
    return float(value)


class DatasetMeta:
    """`info.json`, episodes, tasks, statistics and the optional modality file of one dataset.

    Attributes follow LeRobot: `fps`, `features`, `episodes`, `tasks` ({task_index: text}), `stats`
    ({feature: {stat: array}} or None), `video_keys`, `total_frames`, `version`, plus `modality`.
    """

    def __init__(self, root: str | Path) -> None:
        self.root = Path(root)
        self.info: dict[str, Any] = _read_json(self.root / "meta/info.json")
        self.version = str(self.info.get("codebase_version", ""))
        if self.version not in SUPPORTED:
            raise DatasetFormatError(
                f"{self.root / 'meta/info.json'}: codebase_version {self.version!r} is not one of {SUPPORTED}"
            )
        for name in ("fps", "features", "data_path"):
            if name not in self.info:
                raise DatasetFormatError(f"{self.root / 'meta/info.json'}: missing field {name!r}")
        self.fps = _positive_number(self.info, "fps", self.root / "meta/info.json")
        self.features: dict[str, dict[str, Any]] = dict(self.info["features"])
        self.video_keys = [k for k, f in self.features.items() if f.get("dtype") == "video"]
        self.image_keys = [k for k, f in self.features.items() if f.get("dtype") == "image"]
        if self.is_v3:
            self.tasks = self._tasks_v3()
            self.episodes = self._episodes_v3()
        else:
            self.tasks = self._tasks_v2()
            self.episodes = self._episodes_v2()
        self.total_frames = sum(e.length for e in self.episodes)
        self.stats = self._stats()
        modality_path = self.root / "meta/modality.json"
        self.modality = Modality.load(modality_path) if modality_path.exists() else None
        if self.modality is not None:
            self.modality.validate(self.features, str(modality_path))

    @property
    def is_v3(self) -> bool:
        """True for the v3.0 layout (episodes share data and video files)."""
        return self.version.startswith("v3")

    @property
    def camera_keys(self) -> list[str]:
        """Video and image features (LeRobot's name)."""
        return self.video_keys + self.image_keys

    def episode(self, index: int) -> Episode:
        """The episode with this `episode_index`."""
        for e in self.episodes:
            if e.index == index:
                return e
        raise KeyError(f"{self.root}: no episode {index} (the dataset has {len(self.episodes)} episodes)")

    def _tasks_v2(self) -> dict[int, str]:
        rows = _read_jsonl(self.root / "meta/tasks.jsonl")
        return {int(r["task_index"]): str(r["task"]) for r in rows}

    def _tasks_v3(self) -> dict[int, str]:
        path = self.root / "meta/tasks.parquet"
        table = _read_parquet(path)
        # pandas writes the task strings as the frame's index: a "task" or "__index_level_0__" column
        text_col = next((c for c in ("task", "__index_level_0__") if c in table), None)
        if text_col is None or "task_index" not in table:
            raise DatasetFormatError(f"{path}: expected columns 'task_index' and 'task', got {sorted(table)}")
        return {int(i): str(t) for i, t in zip(table["task_index"], table[text_col])}

    def _episodes_v2(self) -> list[Episode]:
        path = self.root / "meta/episodes.jsonl"
        info_path = self.root / "meta/info.json"
        chunks = int(_positive_number(self.info, "chunks_size", info_path, default=1000, integer=True))
        video_path = self.info.get("video_path")
        episodes = []
        for row in _read_jsonl(path):
            try:
                index, length = int(row["episode_index"]), int(row["length"])
            except KeyError as err:
                raise DatasetFormatError(f"{path}: episode row without {err}: {row}") from None
            chunk = index // chunks
            data = self.root / self.info["data_path"].format(episode_chunk=chunk, episode_index=index)
            videos = {
                key: VideoSpan(
                    self.root / video_path.format(episode_chunk=chunk, video_key=key, episode_index=index)
                )
                for key in self.video_keys
                if video_path
            }
            episodes.append(Episode(index, length, list(row.get("tasks", [])), data, videos))
        return sorted(episodes, key=lambda e: e.index)

    def _episodes_v3(self) -> list[Episode]:
        files = sorted((self.root / "meta/episodes").glob("chunk-*/file-*.parquet"))
        if not files:
            raise DatasetFormatError(f"{self.root / 'meta/episodes'}: no episode parquet files found")
        # only the columns read here: the per-episode statistics columns are most of the file
        wanted = {
            "episode_index",
            "length",
            "tasks",
            "data/chunk_index",
            "data/file_index",
            "dataset_from_index",
        }
        wanted |= {
            f"videos/{k}/{c}"
            for k in self.video_keys
            for c in ("chunk_index", "file_index", "from_timestamp")
        }
        paths: dict[str, Path] = {}  # episodes share files: one Path object per file
        episodes = []
        for path in files:
            table = _read_parquet(path, wanted)
            for i in range(len(table.get("episode_index", []))):
                episodes.append(self._episode_v3(path, {k: v[i] for k, v in table.items()}, paths))
        return sorted(episodes, key=lambda e: e.index)

    def _episode_v3(self, path: Path, row: Mapping[str, Any], paths: dict[str, Path]) -> Episode:
        def need(name: str) -> Any:
            if name not in row or row[name] is None:
                raise DatasetFormatError(f"{path}: episode {row.get('episode_index')} has no {name!r}")
            return row[name]

        def under_root(relative: str) -> Path:
            return paths.get(relative) or paths.setdefault(relative, self.root / relative)

        index = int(need("episode_index"))
        data = under_root(
            self.info["data_path"].format(
                chunk_index=int(need("data/chunk_index")), file_index=int(need("data/file_index"))
            )
        )
        videos = {}
        for key in self.video_keys:
            if row.get(f"videos/{key}/chunk_index") is None:
                continue  # declared but never written: ignored unless asked for
            file = self.info["video_path"].format(
                video_key=key,
                chunk_index=int(row[f"videos/{key}/chunk_index"]),
                file_index=int(row[f"videos/{key}/file_index"]),
            )
            videos[key] = VideoSpan(under_root(file), float(row.get(f"videos/{key}/from_timestamp") or 0.0))
        return Episode(
            index,
            int(need("length")),
            list(row.get("tasks") or []),
            data,
            videos,
            int(need("dataset_from_index")),
        )

    def _stats(self) -> Stats | None:
        path = self.root / "meta/stats.json"
        if path.exists():
            return stats_from_json(_read_json(path))
        per_episode = self.root / "meta/episodes_stats.jsonl"
        if per_episode.exists():
            return aggregate_stats([stats_from_json(r.get("stats", {})) for r in _read_jsonl(per_episode)])
        return None

    def __repr__(self) -> str:
        return (
            f"DatasetMeta({str(self.root)!r}, version={self.version}, fps={self.fps:g}, "
            f"episodes={len(self.episodes)}, frames={self.total_frames}, videos={self.video_keys})"
        )
