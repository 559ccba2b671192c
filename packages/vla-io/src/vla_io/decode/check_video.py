"""The video half of `vla-io check`: which jobs decode which frames, and one job's work.

A job is one video file of one camera and a run of episodes in it: it opens the file once and checks each
episode's frame range. Opening is the expensive part for LeRobot v3.0 files (hundreds of episodes in a
200 MB file; torchcodec's exact seek mode scans the whole file on open), so episodes sharing a file share
a job; a file is split over a few jobs only when there are fewer files than workers. Each episode's result
goes to `emit` as soon as it is known: a job whose process dies has lost only its unfinished episodes.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..dataset.table import index_ranges
from .problem import Problem
from .readers import open_reader

CHUNK = 32  # frames decoded per request; a failing chunk is retried frame by frame to find the bad ones
TOLERANCE_S = 1e-4  # LeRobotDataset's default: a frame must come back at its expected time within this

# (problems, frames decoded, facts): the facts feed `check_shapes`
Result = tuple[list[Problem], int, list[tuple]]
EpisodeCheck = Callable[..., Result]


@dataclass(frozen=True)
class EpisodeSpan:
    """One episode's frames in a video file: `length` frames from frame `first`."""

    episode: int
    first: int
    length: int
    own_file: bool  # v2.x: the file holds this episode only, so it must have exactly `length` frames


@dataclass(frozen=True)
class VideoJob:
    """Episodes of one camera in one video file, checked with one open reader."""

    path: str
    key: str
    fps: float
    backend: str
    spans: tuple[EpisodeSpan, ...]

    @property
    def size(self) -> int:
        """Episodes in the job: its share of the progress bar."""
        return len(self.spans)

    def failed(self, reason: str, spans: Sequence[EpisodeSpan] | None = None) -> list[Problem]:
        """`reason` as a problem of each episode in `spans` (all of the job's by default)."""
        return [Problem(self.path, s.episode, self.key, "all", reason) for s in spans or self.spans]


def plan_video_jobs(meta: Any, backend: str, workers: int) -> list[VideoJob]:
    """One job per (video file, camera); with fewer files than `workers`, each file's episodes are split
    into runs of about equal frames so every worker has a share. Episodes of length 0 have no job."""
    groups: dict[tuple[str, str], list[EpisodeSpan]] = {}
    for ep in meta.episodes:
        for key, span in ep.videos.items() if ep.length > 0 else ():
            first = int(round(span.from_timestamp * meta.fps))
            own = ep.dataset_from_index is None
            groups.setdefault((str(span.path), key), []).append(EpisodeSpan(ep.index, first, ep.length, own))
    total = sum(s.length for spans in groups.values() for s in spans)
    jobs = []
    for (path, key), spans in groups.items():
        spans.sort(key=lambda s: s.first)
        frames = sum(s.length for s in spans)
        parts = 1 if len(groups) >= workers else min(len(spans), max(1, round(workers * frames / total)))
        jobs += [VideoJob(path, key, meta.fps, backend, run) for run in _split(spans, parts)]
    return jobs


def _split(spans: list[EpisodeSpan], parts: int) -> list[tuple[EpisodeSpan, ...]]:
    """`spans` in `parts` consecutive runs of about equal frames, none empty."""
    if parts <= 1:
        return [tuple(spans)]
    ends = np.cumsum([s.length for s in spans])
    cuts = np.searchsorted(ends, ends[-1] * np.arange(1, parts) / parts, side="left") + 1
    bounds = sorted({0, len(spans), *(int(c) for c in cuts if 0 < c < len(spans))})
    return [tuple(spans[a:b]) for a, b in zip(bounds, bounds[1:])]


def run_video_job(job: VideoJob, check_episode: EpisodeCheck, emit: Callable[[int, Result], None]) -> None:
    """Open `job`'s file once and check each episode with `check_episode`; each episode's result goes to
    `emit(episode, result)`. An episode whose check raises is a problem of that episode alone."""
    try:
        reader = open_reader(job.path, backend=job.backend)
    except FileNotFoundError:
        reason = "video file not found"
    except Exception as err:
        reason = f"cannot open: {err}".replace(f"{job.path}: ", "")
    else:
        reason = ""
    for s in job.spans:
        if reason:
            emit(s.episode, (job.failed(reason, [s]), 0, []))
            continue
        try:
            result = check_episode(
                job.path, s.episode, job.key, s.first, s.length, job.fps, s.own_file, reader
            )
        except Exception as err:
            result = (job.failed(f"the check failed ({type(err).__name__}: {err})", [s]), 0, [])
        emit(s.episode, result)


def check_episode_video(
    path: str, episode: int, key: str, first: int, length: int, fps: float, own_file: bool, reader: Any
) -> Result:
    """Decode every frame of one episode from an open reader; bad frames are reported as episode frame
    ranges. The fact: the frame sizes decoded (`check_shapes.size_findings`)."""
    problems = []
    count = reader.num_frames
    if count < first + length or (own_file and count != length):
        problems.append(Problem(
            path, episode, key, "",
            f"the video has {count} frames but the episode needs frames {first}..{first + length - 1} ({length} rows)",
        ))  # fmt: skip
    bad: dict[int, str] = {}
    sizes: dict[tuple[int, int], list[int]] = {}
    decoded = 0
    for start in range(first, first + length, CHUNK):
        wanted = list(range(start, min(start + CHUNK, first + length)))
        try:
            decoded += _decode(reader, wanted, fps, bad, sizes)
        except Exception:
            for index in wanted:  # find exactly which frames fail
                try:
                    decoded += _decode(reader, [index], fps, bad, sizes)
                except Exception as err:
                    bad[index] = f"{type(err).__name__}: {err}".replace(f"{path}: ", "")
    by_kind: dict[str, tuple[str, list[int]]] = {}  # errors that differ only in their numbers go together
    for index, reason in sorted(bad.items()):
        by_kind.setdefault(re.sub(r"\d+(\.\d+)?", "#", reason), (reason, []))[1].append(index - first)
    for reason, frames in by_kind.values():
        problems.append(
            Problem(path, episode, key, index_ranges(frames), f"{len(frames)} frame(s) fail, e.g. {reason}")
        )
    in_episode = {size: [i - first for i in frames] for size, frames in sizes.items()}
    return problems, decoded, [("video", path, episode, key, in_episode)]


def _decode(
    reader: Any, indices: list[int], fps: float, bad: dict[int, str], sizes: dict[tuple[int, int], list[int]]
) -> int:
    """Decode `indices`; frames outside the file or at the wrong time go into `bad`, each frame's index
    under its (height, width) into `sizes`. Returns frames decoded."""
    inside = [i for i in indices if i < reader.num_frames]
    for i in indices[len(inside) :]:
        bad[i] = "beyond the end of the video"
    if not inside:
        return 0
    frames, pts = reader.frames_at(inside)
    sizes.setdefault(tuple(frames.shape[-2:]), []).extend(inside)
    for i, t in zip(inside, np.asarray(pts, dtype=np.float64)):
        if abs(t - i / fps) > TOLERANCE_S:
            bad[i] = f"decoded at {t:.4f} s instead of {i / fps:.4f} s"
    return len(inside)
