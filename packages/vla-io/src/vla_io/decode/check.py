"""`vla-io check DATASET`: read every parquet row and decode every video frame of a dataset, in parallel, and
list every problem by file, episode and frame: what training would otherwise run into hours in.

Checked per episode: the data file's rows (count, `frame_index`, NaN/inf values, a `task_index` that names
a task of the tasks file, timestamps 1/fps apart), each camera's video (it opens, holds the episode's
frames, every frame decodes at its expected time). Across files (`check_shapes`): features info.json
declares that data files lack, frames at another size than their camera's (or a camera at another size
than declared). And episodes with no frames, or with data but missing from the episodes index.
A check that fails in itself (a crashed decoder) is a problem of its episode, never the end of the report.

Jobs: one per data file, and one per (video file, camera) that opens the file once for all its episodes
(`check_video`: a v3.0 file holds hundreds); the progress bar counts episodes, once for the rows and once
per camera.
"""

from __future__ import annotations

import multiprocessing
import time
from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from .._errors import DatasetFormatError
from ..dataset.index_check import unindexed_episodes
from ..dataset.meta import DatasetMeta
from ..dataset.table import FrameTable, index_ranges, unknown_task_reason, unknown_task_rows
from .check_shapes import column_findings, size_findings
from .check_video import TOLERANCE_S, Result, VideoJob, check_episode_video, plan_video_jobs, run_video_job
from .ffmpeg import resolve_backend
from .problem import Problem
from .readers import BACKENDS

_check_video = check_episode_video  # looked up at each call, so a test can make one episode's check fail
_RESULTS: Any = None  # in a worker process: the queue each video episode's result goes to
EMPTY = "length 0 in the episodes index: LeRobotDataset skips it, with a warning"


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
    by_file: dict[Path, list[int]] = {}
    for pos, ep in enumerate(meta.episodes):
        if ep.length > 0:
            by_file.setdefault(ep.data_path, []).append(pos)
    workers = workers or multiprocessing.cpu_count()
    video_jobs = plan_video_jobs(meta, video_backend, workers)
    jobs: list[Any] = [("data", str(meta.root), positions) for positions in by_file.values()] + video_jobs
    decoded = 0
    facts: dict[str, list] = {"data": [], "video": []}
    for found, frames, job_facts in _run_jobs(jobs, workers, progress):
        problems += [Problem(_rel(meta, Path(p.file)), p.episode, p.key, p.frames, p.reason) for p in found]
        decoded += frames
        for fact in job_facts:
            facts[fact[0]].append(fact[1:])
    findings = column_findings(meta, facts["data"]) + size_findings(meta, facts["video"])
    problems += [Problem(_rel(meta, Path(file)), *rest) for file, *rest in findings]
    problems.sort(key=lambda p: (p.file, p.episode if p.episode is not None else -1, p.key or ""))
    elapsed = time.perf_counter() - started
    videos = len({(job.path, job.key) for job in video_jobs})
    return CheckReport(meta.root, len(meta.episodes), len(by_file), videos, decoded, elapsed, problems)


def _rel(meta: DatasetMeta, path: Path) -> str:
    return str(path.relative_to(meta.root)) if path.is_relative_to(meta.root) else str(path)


def _run_jobs(jobs: list[Any], workers: int, progress: bool):
    """Run `jobs` (in `workers` processes, or here for 1) and yield results: one per data file, one per
    episode and camera. The bar counts episodes checked: each episode once for its rows, once per camera."""
    from tqdm.auto import tqdm

    bar = tqdm(
        total=sum(_size(job) for job in jobs),
        desc="checking rows and cameras",
        unit="episode",
        disable=not progress,
    )
    if workers <= 1:
        for job in jobs:
            yield from _run_here(job, bar)
        bar.close()
        return
    methods = multiprocessing.get_all_start_methods()
    context = multiprocessing.get_context("fork" if "fork" in methods else "spawn")
    queue = context.SimpleQueue()  # put() writes before it returns: nothing a dying worker sent is lost
    received: dict[int, set[int]] = {}  # video episodes whose results arrived, per job
    with ProcessPoolExecutor(workers, mp_context=context, initializer=_set_queue, initargs=(queue,)) as pool:
        futures = {pool.submit(_run_job, number, job): number for number, job in enumerate(jobs)}
        pending = set(futures)
        while pending:
            done, pending = wait(pending, timeout=0.1, return_when=FIRST_COMPLETED)
            while not queue.empty():  # drained after `wait`: a finished job's episodes are all here
                number, episode, result = queue.get()
                received.setdefault(number, set()).add(episode)
                bar.update()
                yield result
            for future in done:
                job = jobs[futures[future]]
                try:
                    result = future.result()
                except Exception as err:  # the process died (a decoder crash): its unfinished episodes
                    reason = f"the checking process died ({type(err).__name__}: {err})"
                    result = _failed(job, reason, received.get(futures[future], set()))
                if result is not None:
                    bar.update(len(result[0]) if isinstance(job, VideoJob) else _size(job))
                    yield result
    bar.close()


def _size(job: Any) -> int:
    return job.size if isinstance(job, VideoJob) else len(job[2])


def _set_queue(queue: Any) -> None:
    global _RESULTS
    _RESULTS = queue


def _run_here(job: Any, bar: Any):
    """Run one job in this process, yielding its results."""
    if not isinstance(job, VideoJob):
        yield _run_job(0, job)
        bar.update(_size(job))
        return
    results: list[Result] = []
    run_video_job(job, _check_video, lambda episode, result: (results.append(result), bar.update()))
    yield from results


def _run_job(number: int, job: Any) -> Result | None:
    """A data job returns its result; a video job (in a worker process) puts each episode's on the queue."""
    if isinstance(job, VideoJob):
        run_video_job(job, _check_video, lambda episode, result: _RESULTS.put((number, episode, result)))
        return None
    try:
        return _check_data(*job[1:])
    except Exception as err:
        return _failed(job, f"the check failed ({type(err).__name__}: {err})")


def _failed(job: Any, reason: str, finished: set[int] = frozenset()) -> Result | None:
    """A job that could not finish, as problems naming its file (and each unfinished episode and camera
    of a video job), or None when every episode had been checked."""
    if isinstance(job, VideoJob):
        unfinished = [s for s in job.spans if s.episode not in finished]
        return (job.failed(reason, unfinished), 0, []) if unfinished else None
    meta = DatasetMeta(job[1])
    episodes = [meta.episodes[p] for p in job[2]]
    episode = episodes[0].index if len(episodes) == 1 else None
    return [Problem(str(episodes[0].data_path), episode, None, "", reason)], 0, []


def _check_data(root: str, positions: list[int]) -> Result:
    """Rows of one data file: count and frame_index per episode (FrameTable's own checks), then each
    episode's rows (`_row_problems`). The fact: the file's columns (`check_shapes.column_findings`)."""
    meta = DatasetMeta(root)  # cheap, and nothing large crosses the process boundary
    episodes = [meta.episodes[p] for p in positions]
    path = episodes[0].data_path
    skip = set(meta.video_keys) | set(meta.image_keys)
    try:
        columns = FrameTable._read_file(str(path), episodes, positions, skip, strict=True)
    except DatasetFormatError as err:
        return [Problem(str(path), None, None, "", str(err).removeprefix(f"{path}: "))], 0, []
    problems = []
    for pos, ep in zip(positions, episodes):
        problems += _row_problems(meta, str(path), ep.index, columns[pos])
    return problems, 0, [("data", str(path), [ep.index for ep in episodes], list(columns[positions[0]]))]


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
