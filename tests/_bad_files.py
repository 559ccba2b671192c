"""Bad files, as a fault campaign found them, made in a copy of a synthetic v2.1 dataset (one file per episode):
each function breaks `root` in place and returns the path of the file it broke."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pyarrow.parquet as pq


def video(root: Path, key: str, episode: int) -> Path:
    return next(root.glob(f"videos/**/{key}/episode_{episode:06d}.mp4"))


def data_file(root: Path, episode: int) -> Path:
    return next(root.glob(f"data/**/episode_{episode:06d}.parquet"))


def video_at_another_size(root: Path, other: Path, key: str, episode: int) -> Path:
    """Episode `episode`'s video of camera `key` replaced by the same episode's video of `other`, a dataset
    written with the same settings but another image size: same frames and times, another resolution."""
    path = video(root, key, episode)
    shutil.copyfile(video(other, key, episode), path)
    return path


def all_videos_at_another_size(root: Path, other: Path, key: str) -> list[Path]:
    """Every video of camera `key` taken from `other` (re-encoded at another size, info.json not updated)."""
    return [
        video_at_another_size(root, other, key, int(path.stem.split("_")[-1]))
        for path in sorted(root.glob(f"videos/**/{key}/*.mp4"))
    ]


def without_column(root: Path, episode: int, column: str) -> Path:
    """Episode `episode`'s data file rewritten without `column`."""
    path = data_file(root, episode)
    pq.write_table(pq.read_table(path).drop([column]), path)
    return path


def zero_frame_episode(root: Path, episode: int) -> Path:
    """Episode `episode` emptied: its data file keeps its columns but no rows, the episodes index says
    length 0 (as a recorder writes an episode stopped before its first frame; the video stays)."""
    path = data_file(root, episode)
    pq.write_table(pq.read_table(path).slice(0, 0), path)
    index = root / "meta" / "episodes.jsonl"
    rows = [json.loads(line) for line in index.read_text().splitlines()]
    for row in rows:
        if row["episode_index"] == episode:
            row["length"] = 0
    index.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return path
