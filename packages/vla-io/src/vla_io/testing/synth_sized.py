"""Synthetic LeRobot v3.0 datasets with files of real size, written fast.

LeRobot v3.0 appends episodes to a camera's current video file until the next episode would bring it to
`video_files_size_in_mb` (200 MiB by default), then starts a new file; data files roll over the same way at
`data_files_size_in_mb` (100 MiB); file numbers run to `chunks_size` (1000) files per chunk folder
(lerobot `datasets/utils.py`: DEFAULT_VIDEO_FILE_SIZE_IN_MB, DEFAULT_DATA_FILE_SIZE_IN_MB,
DEFAULT_CHUNK_SIZE, `update_chunk_file_indices`; the rule `latest_size_in_mb + ep_size_in_mb >= limit` is in
its episode writer). This module writes such files.

Encoding every frame of thousands of episodes would take many minutes, so `pool_episodes` distinct episodes
are encoded once per camera (in parallel), and episode e of the dataset copies the compressed packets of pool
episode e % pool_episodes into its camera's current file with shifted timestamps: a remux, nothing decoded or
encoded again (LeRobot concatenates its per-episode videos the same way). Every pool file starts with a
keyframe, so every episode of the big files does too. The frames of episode e carry the markers of its pool
episode (`pool_frame_index`); the parquet rows, generated for the whole dataset in one vectorized call,
identify the dataset's own rows (global index, episode, frame) like every synthetic dataset's.
"""

from __future__ import annotations

import fractions
import io
import multiprocessing
import os
import tempfile
from concurrent.futures import Executor, Future, ProcessPoolExecutor, as_completed
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from ..dataset.stats import aggregate_stats, feature_stats, stats_to_json
from . import synth_layout as layout
from .synth import SynthConfig
from .synth_content import ContentGenerator
from .video_write import VideoWriter

MIB = 1024**2  # LeRobot's file sizes "in MB" are bytes / 1024**2


def plan_files(sizes: list[float], limit: float) -> list[int]:
    """File number of each episode, given each episode's size: LeRobot's rule, a new file when the current
    one plus the next episode would reach `limit` (a fresh file always takes the episode)."""
    numbers, current, filled = [], 0, 0.0
    for size in sizes:
        if filled > 0 and filled + size >= limit:
            current, filled = current + 1, 0.0
        numbers.append(current)
        filled += size
    return numbers


def pool_size(cfg: SynthConfig) -> int:
    """Number of distinct (encoded) episodes."""
    return min(cfg.pool_episodes, cfg.episodes)


def pool_frame_index(cfg: SynthConfig, episode: int, frame: int) -> int:
    """The global index that frame `frame` of episode `episode` carries in its marker: that of the same frame
    of its pool episode (the dataset's own index for the first `pool_episodes` episodes)."""
    lengths = cfg.lengths()
    source = episode % pool_size(cfg)
    return int(sum(lengths[:source])) + frame


def _encode_pool_episode(job: tuple) -> tuple[int, dict | None]:
    """Encode one pool episode of one camera; returns the file's size and statistics of sampled frames."""
    cfg, camera, episode, start, length, path = job
    gen = ContentGenerator(cfg)
    height, width = cfg.sizes()[camera]
    sampled = []
    with VideoWriter(path, cfg.codec, cfg.fps, width, height, cfg.gop) as writer:
        for f in range(length):
            image = gen.frame(camera, episode, f, start + f)
            writer.write(image)
            if cfg.stats and f % layout.STATS_EVERY == 0:
                sampled.append(image.transpose(2, 0, 1).astype(np.float32) / 255.0)
    return os.path.getsize(path), feature_stats(np.stack(sampled)) if sampled else None


def _remux(job: tuple) -> tuple[str, int]:
    """Write one video file: the packets of each listed pool file in turn, timestamps shifted so that they
    follow one another at 1/fps. Returns the path and the number of frames written."""
    import av

    out_path, sources, lengths, fps = job
    Path(out_path).parent.mkdir(parents=True, exist_ok=True)
    with av.open(sources[0]) as template:
        out = av.open(out_path, "w", options={"movflags": "faststart"})
        stream = out.add_stream_from_template(template.streams.video[0], opaque=True)
    frames = 0
    try:
        for source, length in zip(sources, lengths):
            with av.open(source) as container:
                video = container.streams.video[0]
                step = fractions.Fraction(1, fps) / video.time_base
                if step.denominator != 1:
                    raise ValueError(f"{source}: time base {video.time_base} does not divide 1/{fps} s")
                shift, count = frames * int(step), 0
                for packet in container.demux(video):
                    if packet.size == 0:  # the demuxer's final empty packet
                        continue
                    packet.pts += shift
                    packet.dts += shift
                    packet.stream = stream
                    out.mux(packet)
                    count += 1
            if count != length:
                raise ValueError(f"{source}: {count} packets where the episode has {length} frames")
            frames += length
    finally:
        out.close()
    return out_path, frames


class _Inline(Executor):
    """Runs each job at once in this process (workers=1)."""

    def submit(self, fn, /, *args, **kwargs) -> Future:  # type: ignore[override]
        future: Future = Future()
        try:
            future.set_result(fn(*args, **kwargs))
        except BaseException as err:  # handed to the caller through the future, like a process pool
            future.set_exception(err)
        return future


def _executor(workers: int) -> Executor:
    if workers <= 1:
        return _Inline()
    methods = multiprocessing.get_all_start_methods()
    context = multiprocessing.get_context("fork" if "fork" in methods else "spawn")  # fork: no re-imports
    return ProcessPoolExecutor(workers, mp_context=context)


def _check_same_codec_setup(paths: list[str]) -> None:
    """Packets of several encodes share one stream only if their codec setup (extradata) is the same."""
    import av

    setups = {}
    for path in paths:
        with av.open(path) as container:
            setups.setdefault(bytes(container.streams.video[0].codec_context.extradata or b""), path)
    if len(setups) > 1:
        raise RuntimeError(
            f"pool videos differ in codec setup, cannot be concatenated: {sorted(setups.values())}"
        )


def _episode_stats(rows: dict[str, np.ndarray], starts: np.ndarray, lengths: np.ndarray) -> dict[str, list]:
    """Per-episode mean, std, min, max and count of every column (v3.0's `stats/...` columns), vectorized."""
    out: dict[str, list] = {}
    counts = lengths[:, None].astype(np.float64)
    for name, values in rows.items():
        x = values.reshape(len(values), -1).astype(np.float64)
        mean = np.add.reduceat(x, starts, axis=0) / counts
        second = np.add.reduceat(x * x, starts, axis=0) / counts
        for stat, value in (
            ("mean", mean),
            ("std", np.sqrt(np.maximum(second - mean**2, 0.0))),
            ("min", np.minimum.reduceat(x, starts, axis=0)),
            ("max", np.maximum.reduceat(x, starts, axis=0)),
            ("count", lengths[:, None]),
        ):
            out[f"stats/{name}/{stat}"] = value.tolist()
    return out


def _write_data(
    root: Path, cfg: SynthConfig, rows: dict, lengths: np.ndarray, starts: np.ndarray
) -> list[int]:
    """Write the data files (rolled over at `data_file_size_mb`); returns each episode's file number."""
    table = layout.arrow_table(rows)
    sample = table.slice(0, min(len(table), 20_000))
    buffer = io.BytesIO()
    pq.write_table(sample, buffer)
    bytes_per_row = buffer.tell() / max(1, len(sample))  # LeRobot also rolls over on the average row size
    numbers = plan_files((lengths * bytes_per_row / MIB).tolist(), cfg.data_file_size_mb)
    ends = starts + lengths
    for number in sorted(set(numbers)):
        mine = [e for e, n in enumerate(numbers) if n == number]
        first, last = int(starts[mine[0]]), int(ends[mine[-1]])
        chunk, file = divmod(number, layout.CHUNK_SIZE)
        path = root / layout.V30_DATA.format(chunk_index=chunk, file_index=file)
        path.parent.mkdir(parents=True, exist_ok=True)
        pq.write_table(table.slice(first, last - first), path)
    return numbers


def write_sized_v30(root: Path, cfg: SynthConfig, progress: bool = True, workers: int | None = None) -> None:
    """Write a v3.0 dataset whose files are sized as LeRobot sizes them, under `root` (exists, empty)."""
    workers = max(1, workers if workers is not None else os.cpu_count() or 1)
    lengths = np.asarray(cfg.lengths(), dtype=np.int64)
    starts = np.concatenate([[0], np.cumsum(lengths)[:-1]]).astype(np.int64)
    with tempfile.TemporaryDirectory(prefix=".synth-pool-", dir=root) as tmp, _executor(workers) as executor:
        pool = _encode_pool(executor, cfg, starts, lengths, tmp, progress)
        videos, spans = _submit_videos(executor, root, cfg, lengths, pool)
        # the rows, while the workers write the videos
        total = int(lengths.sum())
        episode_of_row = np.repeat(np.arange(cfg.episodes), lengths)
        frame_of_row = np.arange(total) - np.repeat(starts, lengths)
        rows = ContentGenerator(cfg).rows_of(episode_of_row, frame_of_row, np.arange(total))
        data_files = np.asarray(_write_data(root, cfg, rows, lengths, starts))
        _wait_for(videos, cfg.episodes * len(cfg.cameras), progress)
    _write_meta(root, cfg, lengths, starts, rows, data_files, spans, pool.image_stats)


class _Pool:
    """The encoded pool: each camera's files, their sizes and their frames' statistics."""

    def __init__(self, cameras: int, size: int) -> None:
        self.paths = [[""] * size for _ in range(cameras)]
        self.bytes = np.zeros((cameras, size))
        self.image_stats: dict[int, list[dict]] = {c: [] for c in range(cameras)}


def _encode_pool(executor: Executor, cfg: SynthConfig, starts, lengths, tmp: str, progress: bool) -> _Pool:
    from tqdm.auto import tqdm

    size = pool_size(cfg)
    copies = np.bincount(np.arange(cfg.episodes) % size, minlength=size)
    pool = _Pool(len(cfg.cameras), size)
    futures = {}
    for c in range(len(cfg.cameras)):
        for p in range(size):
            pool.paths[c][p] = f"{tmp}/{c}-{p}.mp4"
            job = (cfg, c, p, int(starts[p]), int(lengths[p]), pool.paths[c][p])
            futures[executor.submit(_encode_pool_episode, job)] = (c, p)
    bar = tqdm(total=len(futures), desc=f"synth v3.0 encode pool ({cfg.codec})", disable=not progress)
    for future in as_completed(futures):
        c, p = futures[future]
        pool.bytes[c, p], stats = future.result()
        if stats is not None:  # weighted by the number of episodes that show this pool episode
            pool.image_stats[c].append({**stats, "count": stats["count"] * copies[p]})
        bar.update()
    bar.close()
    return pool


def _submit_videos(executor: Executor, root: Path, cfg: SynthConfig, lengths, pool: _Pool):
    """Plan each camera's files and submit one remux per file; returns {future: (frames, episodes)} and
    the episodes' `videos/...` columns."""
    videos, spans = {}, {}
    source = np.arange(cfg.episodes) % pool_size(cfg)
    for c, camera in enumerate(cfg.cameras):
        key = layout.video_key(camera)
        _check_same_codec_setup(pool.paths[c])
        numbers = np.asarray(plan_files((pool.bytes[c, source] / MIB).tolist(), cfg.video_file_size_mb))
        frames_before = np.zeros(cfg.episodes, dtype=np.int64)  # in the episode's file
        for number in np.unique(numbers):
            mine = np.flatnonzero(numbers == number)
            frames_before[mine] = np.concatenate([[0], np.cumsum(lengths[mine])[:-1]])
            chunk, file = divmod(int(number), layout.CHUNK_SIZE)
            out = str(root / layout.V30_VIDEO.format(video_key=key, chunk_index=chunk, file_index=file))
            job = (out, [pool.paths[c][s] for s in source[mine]], lengths[mine].tolist(), cfg.fps)
            videos[executor.submit(_remux, job)] = (int(lengths[mine].sum()), len(mine))
        chunks, files = np.divmod(numbers, layout.CHUNK_SIZE)
        spans[f"videos/{key}/chunk_index"] = chunks.tolist()
        spans[f"videos/{key}/file_index"] = files.tolist()
        spans[f"videos/{key}/from_timestamp"] = (frames_before / cfg.fps).tolist()
        spans[f"videos/{key}/to_timestamp"] = ((frames_before + lengths) / cfg.fps).tolist()
    return videos, spans


def _wait_for(videos: dict, total: int, progress: bool) -> None:
    from tqdm.auto import tqdm

    bar = tqdm(total=total, desc="synth v3.0 write videos", unit="episode", disable=not progress)
    for future in as_completed(videos):
        path, frames = future.result()
        planned, episodes = videos[future]
        if frames != planned:
            raise RuntimeError(f"{path}: wrote {frames} frames, planned {planned}")
        bar.update(episodes)
    bar.close()


def _write_meta(root: Path, cfg: SynthConfig, lengths, starts, rows, data_files, spans, image_stats) -> None:
    """meta/: the episodes index, tasks, statistics, modality and, last, info.json."""
    data_chunks, data_numbers = np.divmod(data_files, layout.CHUNK_SIZE)
    episodes = {
        "episode_index": list(range(cfg.episodes)),
        "tasks": [[cfg.tasks[e % len(cfg.tasks)]] for e in range(cfg.episodes)],
        "length": lengths.tolist(),
        "data/chunk_index": data_chunks.tolist(),
        "data/file_index": data_numbers.tolist(),
        "dataset_from_index": starts.tolist(),
        "dataset_to_index": (starts + lengths).tolist(),
        **spans,
        **(_episode_stats(rows, starts, lengths) if cfg.stats else {}),
        "meta/episodes/chunk_index": [0] * cfg.episodes,
        "meta/episodes/file_index": [0] * cfg.episodes,
    }
    path = root / layout.V30_EPISODES.format(chunk_index=0, file_index=0)
    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.table(episodes), path)
    layout.write_tasks_parquet(root / "meta/tasks.parquet", cfg.tasks)
    if cfg.stats:
        stats = {k: feature_stats(v.reshape(len(v), -1) if v.ndim == 1 else v) for k, v in rows.items()}
        for c, parts in image_stats.items():
            key = layout.video_key(cfg.cameras[c])
            stats[key] = aggregate_stats([{key: part} for part in parts])[key]
        layout.write_json(root / "meta/stats.json", stats_to_json(stats))
    if cfg.modality:
        layout.write_json(root / "meta/modality.json", layout.modality_json(cfg))
    info = layout.info_json(cfg, lengths.tolist())
    layout.write_json(root / "meta/info.json", info)  # last: a dataset with info.json is complete
