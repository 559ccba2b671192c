"""`vla-io check DATASET`: read every parquet row and decode every video frame of a dataset, in parallel, and
list every problem by file, episode and frame: what training would otherwise run into hours in.

Checked per episode: the data file's rows (count, `frame_index`, NaN/inf values, a `task_index` that names
a task of the tasks file, timestamps 1/fps apart), each camera's video (it opens, holds the episode's
frames, every frame decodes at its expected time). Across files (`check_shapes`): features info.json
declares that data files lack, frames at another size than their camera's (or a camera at another size
than declared). And episodes with no frames, or with data but missing from the episodes index.
A check that fails in itself (a crashed decoder) is a problem of its file, never the end of the report.
"""

from __future__ import annotations

import multiprocessing
import re
import time
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from .._errors import DatasetFormatError
from ..dataset.index_check import unindexed_episodes
from ..dataset.meta import DatasetMeta
from ..dataset.table import FrameTable, index_ranges, unknown_task_reason, unknown_task_rows
from .check_shapes import column_findings, size_findings
from .ffmpeg import resolve_backend
from .readers import BACKENDS, open_reader

CHUNK = 32  # frames decoded per request; a failing chunk is retried frame by frame to find the bad ones
TOLERANCE_S = 1e-4  # LeRobotDataset's default: a frame must come back at its expected time within this
EMPTY = "length 0 in the episodes index: LeRobotDataset skips it, with a warning"


@dataclass(frozen=True)
class Problem:
    """One problem: where (file, episode, key, episode frames) and what."""

    file: str
    episode: int | None
    key: str | None
    frames: str
    reason: str

    def line(self) -> str:
        """One line for the report."""
        where = [self.file]
        if self.episode is not None:
            where.append(f"episode {self.episode}")
        if self.key:
            where.append(f"key {self.key!r}")
        if self.frames:
            where.append(f"frames {self.frames}")
        return ", ".join(where) + f": {self.reason}"


@dataclass
class CheckReport:
    """What `check_dataset` found."""

    root: Path
    episodes: int
    data_files: int
    videos: int
    frames_decoded: int
    seconds: float
    problems: list[Problem] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        """True when nothing is wrong."""
        return not self.problems

    def table(self) -> str:
        """The report as text: a summary, then every problem."""
        lines = [
            f"dataset   {self.root}",
            f"checked   {self.episodes} episodes: {self.data_files} data files, {self.videos} videos, "
            f"{self.frames_decoded:,} frames decoded in {self.seconds:.1f} s",
            f"problems  {len(self.problems) or 'none'}",
        ]
        return "\n".join(lines + [f"  {p.line()}" for p in self.problems])


def check_dataset(
    root: str | Path, *, workers: int | None = None, progress: bool = True, video_backend: str = "auto"
) -> CheckReport:
    """Check every data file and decode every video frame of the dataset at `root` (see the module doc)."""
    if video_backend not in BACKENDS:
        raise ValueError(f"video_backend must be one of {BACKENDS}, got {video_backend!r}")
    started = time.perf_counter()
    video_backend = resolve_backend(video_backend)  # loaded once here: forked workers inherit it
    meta = DatasetMeta(root)
    problems = [
        Problem(
            _rel(meta, path),
            episode,
            None,
            "all",
            "has data but is missing from the episodes index (ignored)",
        )
        for path, episode in unindexed_episodes(meta)
    ]
    problems += [
        Problem(_rel(meta, ep.data_path), ep.index, None, "", f"the episode has no frames ({EMPTY})")
        for ep in meta.episodes
        if ep.length == 0
    ]
    jobs: list[tuple[Any, ...]] = []
    by_file: dict[Path, list[int]] = {}
    for pos, ep in enumerate(meta.episodes):
        if ep.length > 0:
            by_file.setdefault(ep.data_path, []).append(pos)
    jobs += [("data", str(meta.root), positions) for positions in by_file.values()]
    videos = 0
    for ep in meta.episodes:
        for key, span in ep.videos.items() if ep.length > 0 else ():
            first = int(round(span.from_timestamp * meta.fps))
            own_file = ep.dataset_from_index is None
            jobs.append(
                ("video", str(span.path), ep.index, key, first, ep.length, meta.fps, own_file, video_backend)
            )
            videos += 1
    decoded = 0
    facts: dict[str, list] = {"data": [], "video": []}
    for found, frames, fact in _run_jobs(jobs, workers, progress):
        problems += [Problem(_rel(meta, Path(p.file)), p.episode, p.key, p.frames, p.reason) for p in found]
        decoded += frames
        if fact is not None:
            facts[fact[0]].append(fact[1:])
    findings = column_findings(meta, facts["data"]) + size_findings(meta, facts["video"])
    problems += [Problem(_rel(meta, Path(file)), *rest) for file, *rest in findings]
    problems.sort(key=lambda p: (p.file, p.episode if p.episode is not None else -1, p.key or ""))
    elapsed = time.perf_counter() - started
    return CheckReport(meta.root, len(meta.episodes), len(by_file), videos, decoded, elapsed, problems)


def _rel(meta: DatasetMeta, path: Path) -> str:
    return str(path.relative_to(meta.root)) if path.is_relative_to(meta.root) else str(path)


def _run_jobs(jobs: list[tuple[Any, ...]], workers: int | None, progress: bool):
    from tqdm.auto import tqdm

    workers = workers or multiprocessing.cpu_count()
    bar = tqdm(total=len(jobs), desc="checking", unit="file", disable=not progress)
    if workers <= 1:
        for job in jobs:
            yield _run_job(job)
            bar.update()
        bar.close()
        return
    methods = multiprocessing.get_all_start_methods()
    context = multiprocessing.get_context("fork" if "fork" in methods else "spawn")
    with ProcessPoolExecutor(max_workers=workers, mp_context=context) as pool:
        futures = {pool.submit(_run_job, job): job for job in jobs}
        for future in as_completed(futures):
            try:
                yield future.result()
            except Exception as err:  # the process died (a decoder crash): its file is a problem
                yield _failed(futures[future], f"the checking process died ({type(err).__name__}: {err})")
            bar.update()
    bar.close()


def _run_job(job: tuple[Any, ...]) -> tuple[list[Problem], int, tuple | None]:
    try:
        return _check_data(*job[1:]) if job[0] == "data" else _check_video(*job[1:])
    except Exception as err:
        return _failed(job, f"the check failed ({type(err).__name__}: {err})")


def _failed(job: tuple[Any, ...], reason: str) -> tuple[list[Problem], int, None]:
    """A job that could not finish, as a problem naming its file (and episode and key for a video)."""
    if job[0] == "data":
        meta = DatasetMeta(job[1])
        episodes = [meta.episodes[p] for p in job[2]]
        episode = episodes[0].index if len(episodes) == 1 else None
        return [Problem(str(episodes[0].data_path), episode, None, "", reason)], 0, None
    return [Problem(job[1], job[2], job[3], "all", reason)], 0, None


def _check_data(root: str, positions: list[int]) -> tuple[list[Problem], int, tuple | None]:
    """Rows of one data file: count and frame_index per episode (FrameTable's own checks), then each
    episode's rows (`_row_problems`). The fact: the file's columns (`check_shapes.column_findings`)."""
    meta = DatasetMeta(root)  # cheap, and nothing large crosses the process boundary
    episodes = [meta.episodes[p] for p in positions]
    path = episodes[0].data_path
    skip = set(meta.video_keys) | set(meta.image_keys)
    try:
        columns = FrameTable._read_file(str(path), episodes, positions, skip, strict=True)
    except DatasetFormatError as err:
        return [Problem(str(path), None, None, "", str(err).removeprefix(f"{path}: "))], 0, None
    problems = []
    for pos, ep in zip(positions, episodes):
        problems += _row_problems(meta, str(path), ep.index, columns[pos])
    return problems, 0, ("data", str(path), [ep.index for ep in episodes], list(columns[positions[0]]))


def _row_problems(
    meta: DatasetMeta, path: str, episode: int, columns: dict[str, np.ndarray]
) -> list[Problem]:
    """One episode's rows: task indices that name a task, timestamps 1/fps apart, finite values."""
    problems = []
    task_index = columns.get("task_index")
    bad_tasks = unknown_task_rows(meta, task_index) if task_index is not None else []
    if len(bad_tasks):
        reason = unknown_task_reason(meta, task_index[bad_tasks])
        frames = index_ranges(bad_tasks)
        problems.append(Problem(path, episode, "task_index", frames, f"{reason} in {len(bad_tasks)} row(s)"))
    timestamp = columns.get("timestamp")
    if timestamp is not None and len(timestamp) > 1 and np.isfinite(timestamp).all():
        problems += _timestamp_steps(path, episode, timestamp, meta.fps)
    for key, values in columns.items():
        if values.dtype.kind != "f" or not len(values):
            continue
        bad = ~np.isfinite(values.reshape(len(values), -1)).all(axis=1)
        if bad.any():
            rows = np.flatnonzero(bad).tolist()
            problems.append(
                Problem(path, episode, key, index_ranges(rows), f"NaN/inf values in {len(rows)} row(s)")
            )
    return problems


def _timestamp_steps(path: str, episode: int, timestamp: np.ndarray, fps: float) -> list[Problem]:
    """Consecutive rows whose timestamps are not 1/fps apart: frames dropped or repeated in the data. The
    default `frame_time="index"` reads video frames and `delta_timestamps` windows by row, so such an
    episode's windows span other times than asked, in silence; `frame_time="timestamp"` reads other frames.
    A constant offset (every timestamp shifted) is not reported: the default `frame_time="index"` ignores it.
    """
    steps = np.diff(timestamp.astype(np.float64))
    # float32 timestamps (LeRobot's) carry rounding that grows with time: allow two units of the last place
    tolerance = max(TOLERANCE_S, 2 * float(np.spacing(np.abs(timestamp).max())))
    bad = np.flatnonzero(np.abs(steps - 1 / fps) > tolerance)
    if not len(bad):
        return []
    first = int(bad[0])
    reason = (
        f"timestamps are not 1/fps = {1 / fps:.4f} s apart at {len(bad)} step(s), e.g. {steps[first]:.4f} s "
        f"from frame {first} to {first + 1} (frames dropped or repeated? video frames and delta_timestamps "
        "windows are read by row)"
    )
    return [Problem(path, episode, "timestamp", index_ranges(bad + 1), reason)]


def _check_video(
    path: str, episode: int, key: str, first: int, length: int, fps: float, own_file: bool, backend: str
) -> tuple[list[Problem], int, tuple | None]:
    """Decode every frame of one episode in one video; bad frames are reported as episode frame ranges.
    The fact: the frame sizes decoded (`check_shapes.size_findings`)."""
    try:
        reader = open_reader(path, backend=backend)
    except FileNotFoundError:
        return [Problem(path, episode, key, "all", "video file not found")], 0, None
    except Exception as err:
        return [Problem(path, episode, key, "all", f"cannot open: {err}".replace(f"{path}: ", ""))], 0, None
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
    return problems, decoded, ("video", path, episode, key, in_episode)


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
