"""File layout of synthetic datasets: LeRobot v2.0 / v2.1 (a file per episode) and v3.0 (shared files)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from ..dataset.stats import feature_stats, stats_to_json
from .synth import SynthConfig
from .synth_content import ContentGenerator
from .video_write import VideoWriter

V21_DATA = "data/chunk-{episode_chunk:03d}/episode_{episode_index:06d}.parquet"
V21_VIDEO = "videos/chunk-{episode_chunk:03d}/{video_key}/episode_{episode_index:06d}.mp4"
V30_DATA = "data/chunk-{chunk_index:03d}/file-{file_index:03d}.parquet"
V30_VIDEO = "videos/{video_key}/chunk-{chunk_index:03d}/file-{file_index:03d}.mp4"
V30_EPISODES = "meta/episodes/chunk-{chunk_index:03d}/file-{file_index:03d}.parquet"
CHUNK_SIZE = 1000
STATS_EVERY = 5  # image statistics from every 5th frame: enough for a synthetic dataset


def video_key(camera: str) -> str:
    return f"observation.images.{camera}"


def _features(cfg: SynthConfig) -> dict:
    features: dict[str, dict] = {}
    for camera, (height, width) in zip(cfg.cameras, cfg.sizes()):
        features[video_key(camera)] = {
            "dtype": "video",
            "shape": [height, width, 3],
            "names": ["height", "width", "channels"],
            "info": {
                "video.height": height,
                "video.width": width,
                "video.codec": cfg.codec,
                "video.pix_fmt": "yuv420p",
                "video.is_depth_map": False,
                "video.fps": cfg.fps,
                "video.channels": 3,
                "video.g": cfg.gop,
                "has_audio": False,
            },
        }
    for key, dim, groups in (
        ("observation.state", cfg.state_dim, _STATE_GROUPS),
        ("action", cfg.action_dim, _ACTION_GROUPS),
    ):
        names = [f"{key.split('.')[-1]}_{i}" for i in range(dim)]
        if cfg.grouped_names:  # LeRobot allows a dict of name lists; each list is a group of the vector
            names = {name: names[s:e] for name, s, e in _groups(dim, groups, key.split(".")[-1])}
        features[key] = {"dtype": "float32", "shape": [dim], "names": names}
    features["timestamp"] = {"dtype": "float32", "shape": [1], "names": None}
    for name in ("frame_index", "episode_index", "index", "task_index"):
        features[name] = {"dtype": "int64", "shape": [1], "names": None}
    return features


_STATE_GROUPS = [("eef_pos", 0, 3), ("eef_axis_angle", 3, 6), ("gripper", 6, 8)]
_ACTION_GROUPS = [("eef_delta_pos", 0, 3), ("eef_delta_rot", 3, 6), ("gripper", 6, 7)]


def _groups(dim: int, named: list[tuple[str, int, int]], fallback: str) -> list[tuple[str, int, int]]:
    """LIBERO-like named slices where the size allows it, else one slice."""
    return named if named[-1][2] == dim else [(fallback, 0, dim)]


def modality_json(cfg: SynthConfig) -> dict:
    """Named slices of the vectors (meta/modality.json), LIBERO-like where the sizes allow it."""
    return {
        "state": {n: {"start": s, "end": e} for n, s, e in _groups(cfg.state_dim, _STATE_GROUPS, "state")},
        "action": {
            n: {"start": s, "end": e} for n, s, e in _groups(cfg.action_dim, _ACTION_GROUPS, "action")
        },
        "video": {c: {"original_key": video_key(c)} for c in cfg.cameras},
        "annotation": {"human.task_description": {"original_key": "task_index"}},
    }


def arrow_table(columns: dict[str, np.ndarray]) -> pa.Table:
    arrays = {}
    for name, values in columns.items():
        if values.ndim == 2:  # fixed-size vectors, as LeRobot stores them
            flat = pa.array(values.reshape(-1))
            arrays[name] = pa.FixedSizeListArray.from_arrays(flat, values.shape[1])
        else:
            arrays[name] = pa.array(values)
    return pa.table(arrays)


def write_json(path: Path, data: object, lines: bool = False) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    if lines:
        path.write_text("".join(json.dumps(row) + "\n" for row in data))  # type: ignore[union-attr]
    else:
        path.write_text(json.dumps(data, indent=2) + "\n")


class _Collector:
    """Rows and sampled frames of the whole dataset, for stats.json."""

    def __init__(self, cfg: SynthConfig) -> None:
        self.rows: list[dict[str, np.ndarray]] = []
        self.frames: dict[str, list[np.ndarray]] = {video_key(c): [] for c in cfg.cameras}

    def frame(self, key: str, frame_index: int, image: np.ndarray) -> None:
        if frame_index % STATS_EVERY == 0:
            self.frames[key].append(image.transpose(2, 0, 1).astype(np.float32) / 255.0)

    def stats(self) -> dict:
        merged = {k: np.concatenate([r[k] for r in self.rows]) for k in self.rows[0]}
        out = {k: feature_stats(v.reshape(len(v), -1) if v.ndim == 1 else v) for k, v in merged.items()}
        out.update({k: feature_stats(np.stack(v)) for k, v in self.frames.items() if v})
        return out


def _episode_frames(gen: ContentGenerator, cfg: SynthConfig, cam: int, ep: int, start: int, length: int):
    for f in range(length):
        yield f, gen.frame(cam, ep, f, start + f)


def info_json(cfg: SynthConfig, lengths: list[int]) -> dict:
    info = {
        "codebase_version": cfg.version,
        "robot_type": "synthetic",
        "total_episodes": cfg.episodes,
        "total_frames": int(sum(lengths)),
        "total_tasks": len(cfg.tasks),
        "chunks_size": CHUNK_SIZE,
        "fps": cfg.fps,
        "splits": {"train": f"0:{cfg.episodes}"},
    }
    if cfg.version != "v3.0":
        info.update(
            total_videos=cfg.episodes * len(cfg.cameras),
            total_chunks=(cfg.episodes - 1) // CHUNK_SIZE + 1,
            data_path=V21_DATA,
            video_path=V21_VIDEO,
        )
    else:
        info.update(
            data_files_size_in_mb=cfg.data_file_size_mb,
            video_files_size_in_mb=cfg.video_file_size_mb or 200,  # LeRobot's defaults: 100 and 200 MiB
            data_path=V30_DATA,
            video_path=V30_VIDEO,
        )
    info["features"] = _features(cfg)
    return info


def write_layout(root: Path, cfg: SynthConfig, gen: ContentGenerator, progress: bool = True) -> None:
    """Write every file of a synthetic dataset under `root` (which exists and is empty)."""
    from tqdm.auto import tqdm

    lengths = cfg.lengths()
    starts = np.concatenate([[0], np.cumsum(lengths)[:-1]]).astype(int).tolist()
    collector = _Collector(cfg)
    episodes = tqdm(range(cfg.episodes), desc=f"synth {cfg.version} {cfg.codec}", disable=not progress)
    if cfg.version != "v3.0":
        _write_v21(root, cfg, gen, lengths, starts, collector, episodes)
    else:
        _write_v30(root, cfg, gen, lengths, starts, collector, episodes)
    write_json(root / "meta/info.json", info_json(cfg, lengths))
    if cfg.stats:
        write_json(root / "meta/stats.json", stats_to_json(collector.stats()))
    if cfg.modality:
        write_json(root / "meta/modality.json", modality_json(cfg))


def _write_v21(root, cfg, gen, lengths, starts, collector, episodes) -> None:
    episode_rows, episode_stats = [], []
    for ep in episodes:
        chunk = ep // CHUNK_SIZE
        rows = gen.rows(ep, starts[ep], lengths[ep])
        collector.rows.append(rows)
        path = root / V21_DATA.format(episode_chunk=chunk, episode_index=ep)
        path.parent.mkdir(parents=True, exist_ok=True)
        pq.write_table(arrow_table(rows), path)
        ep_stats = {
            k: feature_stats(v.reshape(len(v), -1) if v.ndim == 1 else v, False) for k, v in rows.items()
        }
        for cam_i, (cam, (height, width)) in enumerate(zip(cfg.cameras, cfg.sizes())):
            key = video_key(cam)
            sampled = []
            video = root / V21_VIDEO.format(episode_chunk=chunk, video_key=key, episode_index=ep)
            with VideoWriter(video, cfg.codec, cfg.fps, width, height, cfg.gop) as writer:
                for f, image in _episode_frames(gen, cfg, cam_i, ep, starts[ep], lengths[ep]):
                    writer.write(image)
                    collector.frame(key, f, image)
                    if f % STATS_EVERY == 0:
                        sampled.append(image.transpose(2, 0, 1).astype(np.float32) / 255.0)
            ep_stats[key] = feature_stats(np.stack(sampled), False)
        task = cfg.tasks[ep % len(cfg.tasks)]
        episode_rows.append({"episode_index": ep, "tasks": [task], "length": lengths[ep]})
        episode_stats.append({"episode_index": ep, "stats": stats_to_json(ep_stats)})
    write_json(root / "meta/episodes.jsonl", episode_rows, lines=True)
    if cfg.stats and cfg.version == "v2.1":  # v2.0 has only the global stats.json
        write_json(root / "meta/episodes_stats.jsonl", episode_stats, lines=True)
    tasks = [{"task_index": i, "task": t} for i, t in enumerate(cfg.tasks)]
    write_json(root / "meta/tasks.jsonl", tasks, lines=True)


class _V30Files:
    """The data file and the per-camera video files currently being filled."""

    def __init__(self, root: Path, cfg: SynthConfig, keys: list[str]) -> None:
        self.root, self.cfg, self.keys = root, cfg, keys
        self.writers: dict[str, VideoWriter] = {}
        self.rows: list[dict[str, np.ndarray]] = []
        self.where = (0, 0)

    def open(self, chunk: int, file: int) -> None:
        self.close()
        self.where = (chunk, file)
        cfg = self.cfg
        self.writers = {
            k: VideoWriter(
                self.root / V30_VIDEO.format(video_key=k, chunk_index=chunk, file_index=file),
                cfg.codec,
                cfg.fps,
                width,
                height,
                cfg.gop,
            )
            for k, (height, width) in zip(self.keys, cfg.sizes())
        }

    def close(self) -> None:
        for writer in self.writers.values():
            writer.close()
        self.writers = {}
        if self.rows:
            merged = {k: np.concatenate([r[k] for r in self.rows]) for k in self.rows[0]}
            chunk, file = self.where
            path = self.root / V30_DATA.format(chunk_index=chunk, file_index=file)
            path.parent.mkdir(parents=True, exist_ok=True)
            pq.write_table(arrow_table(merged), path)
            self.rows = []


def _write_v30(root, cfg, gen, lengths, starts, collector, episodes) -> None:
    keys = [video_key(c) for c in cfg.cameras]
    meta: dict[str, list] = {}
    files = _V30Files(root, cfg, keys)
    for ep in episodes:
        chunk, file = divmod(ep // cfg.episodes_per_file, CHUNK_SIZE)
        if ep % cfg.episodes_per_file == 0:  # a new data file and new video files begin here
            files.open(chunk, file)
        rows = gen.rows(ep, starts[ep], lengths[ep])
        collector.rows.append(rows)
        files.rows.append(rows)
        row = {
            "episode_index": ep,
            "tasks": [cfg.tasks[ep % len(cfg.tasks)]],
            "length": lengths[ep],
            "data/chunk_index": chunk,
            "data/file_index": file,
            "dataset_from_index": starts[ep],
            "dataset_to_index": starts[ep] + lengths[ep],
        }
        for cam_i, key in enumerate(keys):
            writer = files.writers[key]
            begin = writer.frames_written / cfg.fps
            for f, image in _episode_frames(gen, cfg, cam_i, ep, starts[ep], lengths[ep]):
                writer.write(image)
                collector.frame(key, f, image)
            row[f"videos/{key}/chunk_index"] = chunk
            row[f"videos/{key}/file_index"] = file
            row[f"videos/{key}/from_timestamp"] = begin
            row[f"videos/{key}/to_timestamp"] = writer.frames_written / cfg.fps
        for name, values in rows.items() if cfg.stats else ():
            flat = values.reshape(len(values), -1) if values.ndim == 1 else values
            for stat, value in feature_stats(flat, False).items():
                row[f"stats/{name}/{stat}"] = np.asarray(value, dtype=np.float64).reshape(-1).tolist()
        row["meta/episodes/chunk_index"] = 0
        row["meta/episodes/file_index"] = 0
        for name, value in row.items():
            meta.setdefault(name, []).append(value)
    files.close()
    path = root / V30_EPISODES.format(chunk_index=0, file_index=0)
    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.table(meta), path)
    write_tasks_parquet(root / "meta/tasks.parquet", cfg.tasks)


def write_tasks_parquet(path: Path, tasks: tuple[str, ...]) -> None:
    """tasks.parquet as pandas writes a frame indexed by task string (LeRobot reads it with pandas)."""
    pandas_meta = {
        "index_columns": ["task"],
        "column_indexes": [],
        "columns": [
            {
                "name": "task_index",
                "field_name": "task_index",
                "pandas_type": "int64",
                "numpy_type": "int64",
                "metadata": None,
            },
            {
                "name": "task",
                "field_name": "task",
                "pandas_type": "unicode",
                "numpy_type": "object",
                "metadata": None,
            },
        ],
        "creator": {"library": "pyarrow", "version": pa.__version__},
        "pandas_version": "2.2.0",
    }
    table = pa.table({"task_index": pa.array(range(len(tasks)), pa.int64()), "task": pa.array(list(tasks))})
    table = table.replace_schema_metadata({b"pandas": json.dumps(pandas_meta).encode()})
    pq.write_table(table, path)
