"""vla-io on LeRobot v3.0 files of real size, over minutes: samples/s, decoders and files each worker holds
open, reader opens against samples, and memory, for a real-size set and the small set.

The real-size set is `vla-io synth --version v3.0 --video-file-size-mb 200`: LIBERO-like episodes (two
256x256 AV1 cameras), each camera's episodes concatenated into files of up to 200 MiB, the rows in data
files of up to 100 MiB (LeRobot's defaults), written on first use and timed. The small set is the same
content in small files (4 episodes per file). Both run the same loader: `vla_io.Pipeline`, batch 16, an
action chunk of 16, both cameras cropped, resized to 224x224, jittered and normalized by `ImageAugment` on
--device (the GPU: L3's step).

Every --interval seconds it records, per process (the main one and each worker): RSS and PSS (proportional
set size: shared pages split between the processes that map them, so the sum does not count them twice),
open file descriptors and how many are video files; and per worker, from its `ReaderCache`: decoders open
now, readers opened and evicted so far, samples loaded. A worker that reopened a file per sample would show
`opened` growing with its samples; a cache that grows shows in `open` and in RSS.

    source benchmarks/gpu_env.sh   # on the GPU host
    python benchmarks/io_scale.py --device cuda --minutes 3 --json benchmarks/results/io_scale_h200_$(date +%F).json
    # a CPU check in a minute:
    python benchmarks/io_scale.py --episodes 60 --small-episodes 8 --length 40 --image-size 64 \\
        --video-file-size-mb 1 --minutes 0.25 --warmup 5 --interval 2 --workers 2 --json /tmp/io_scale.json
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import threading
import time
from datetime import datetime, timezone
from pathlib import Path

import numpy as np
import torch
import vla_io
from vla_io import ImageAugment, ImageTransformConfig, LeRobotDataset, Pipeline

CHUNK = 16
TARGET_SAMPLES_PER_S = 2000  # issue 37: two cameras, augmentation on the GPU


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--synth-dir", default="/tmp/vla_io_scale", help="where the synthetic sets are written")
    p.add_argument("--episodes", type=int, default=2000, help="episodes of the real-size set")
    p.add_argument("--small-episodes", type=int, default=20, help="episodes of the small set")
    p.add_argument("--length", type=int, default=200, help="frames of the longest episode")
    p.add_argument("--image-size", type=int, default=256)
    p.add_argument("--codec", choices=["av1", "h264"], default="av1")
    p.add_argument("--video-file-size-mb", type=float, default=200.0)
    p.add_argument("--data-file-size-mb", type=float, default=100.0)
    p.add_argument("--pool-episodes", type=int, default=16)
    p.add_argument("--sets", default="real,small", help="which sets to run, in order: real, small")
    p.add_argument("--batch-size", type=int, default=16)
    p.add_argument(
        "--workers", type=int, default=max(1, (os.cpu_count() or 2) - 4), help="L1 worker processes"
    )
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--no-augment", action="store_true", help="deliver uint8 frames (no ImageAugment)")
    p.add_argument("--decoder", choices=["auto", "torchcodec", "pyav"], default="auto")
    p.add_argument("--max-open-videos", type=int, default=256, help="LeRobotDataset's reader cache size")
    p.add_argument("--minutes", type=float, default=3.0, help="run time per set (the issue asks for 20)")
    p.add_argument("--warmup", type=float, default=30.0, help="seconds left out of the steady rate")
    p.add_argument("--interval", type=float, default=5.0, help="seconds between samples of memory and files")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", help="write the results here")
    return p.parse_args(argv)


def make_set(args, name: str) -> tuple[Path, float | None]:
    """The dataset's root and the seconds it took to write (None: it was there already)."""
    base = vla_io.testing.SYNTH_PRESETS["libero"].with_(
        version="v3.0", codec=args.codec, episode_length=args.length, image_size=args.image_size
    )
    if name == "real":
        cfg = base.with_(
            episodes=args.episodes, video_file_size_mb=args.video_file_size_mb,
            data_file_size_mb=args.data_file_size_mb, pool_episodes=args.pool_episodes,
        )  # fmt: skip
        tag = f"sized-{args.episodes}x{args.length}-{args.image_size}px-{args.video_file_size_mb:g}MiB"
    else:
        cfg, tag = (
            base.with_(episodes=args.small_episodes),
            f"{args.small_episodes}x{args.length}-{args.image_size}px",
        )
    root = Path(args.synth_dir) / f"libero-v3.0-{args.codec}-{tag}"
    if (root / "meta/info.json").exists():
        return root, None
    started = time.perf_counter()
    vla_io.write_synthetic_dataset(root, cfg, overwrite=True)
    return root, time.perf_counter() - started


class CountingDataset(LeRobotDataset):
    """Adds each batch's worker id and its reader cache counts: (pid, open, opened, evicted) per sample."""

    def get_batch(self, indices, *, image_dtype=None, shared_memory=False):
        batch = super().get_batch(indices, image_dtype=image_dtype, shared_memory=shared_memory)
        s = self._fetcher.readers.stats()
        row = [os.getpid(), s["open"], s["opened"], s["evicted"]]
        batch["reader_stats"] = torch.tensor([row] * len(batch["index"]), dtype=torch.int64)
        return batch


class Recorder:
    """The pipeline's host transform: takes the reader counts off each batch (so they never go to the GPU)
    and keeps each worker's latest counts and its samples."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.workers: dict[int, dict[str, int]] = {}

    def __call__(self, batch: dict) -> dict:
        rows = batch.pop("reader_stats").tolist()
        with self.lock:
            for pid, open_, opened, evicted in rows:
                w = self.workers.setdefault(pid, {"samples": 0, "open": 0, "opened": 0, "evicted": 0})
                w["samples"] += 1
                w["open"], w["opened"] = max(w["open"], open_), max(w["opened"], opened)
                w["evicted"] = max(w["evicted"], evicted)
                w["max_open"] = max(w.get("max_open", 0), open_)
        return batch

    def snapshot(self) -> dict[int, dict[str, int]]:
        with self.lock:
            return {pid: dict(w) for pid, w in self.workers.items()}


def proc_memory(pid: int | str) -> dict[str, float]:
    """RSS, its anonymous / file / shared-memory parts and PSS of a process, in MiB."""
    out: dict[str, float] = {}
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            name, _, value = line.partition(":")
            if name in ("VmRSS", "RssAnon", "RssFile", "RssShmem"):
                out[name] = int(value.split()[0]) / 1024
        for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
            if line.startswith("Pss:"):
                out["Pss"] = int(line.split()[1]) / 1024
    except OSError:
        pass
    return out


def proc_files(pid: int | str) -> dict[str, int]:
    """Open file descriptors of a process, and how many are mp4 / parquet files."""
    fds = videos = parquet = 0
    try:
        for fd in os.listdir(f"/proc/{pid}/fd"):
            fds += 1
            try:
                target = os.readlink(f"/proc/{pid}/fd/{fd}")
            except OSError:
                continue
            videos += target.endswith(".mp4")
            parquet += target.endswith(".parquet")
    except OSError:
        pass
    return {"fds": fds, "video_files": videos, "parquet_files": parquet}


def make_augment(keys, args):
    if args.no_augment:
        return None
    cfg = ImageTransformConfig(
        size=(224, 224), crop_scale=(0.8, 1.0), brightness=0.3, contrast=0.4, saturation=0.5, hue=5,
        mean=(0.5, 0.5, 0.5), std=(0.5, 0.5, 0.5), same_across_views=False,
    )  # fmt: skip
    return ImageAugment(cfg, keys, stack_as="images")


def describe_files(root: Path) -> dict:
    def sizes(pattern):
        return sorted(p.stat().st_size / 2**20 for p in root.glob(pattern))

    videos, data = sizes("videos/*/chunk-*/file-*.mp4"), sizes("data/chunk-*/file-*.parquet")
    return {
        "video_files": len(videos), "video_file_mib_max": max(videos), "video_file_mib_median": float(np.median(videos)),
        "data_files": len(data), "data_file_mib_max": max(data), "total_gib": (sum(videos) + sum(data)) / 1024,
    }  # fmt: skip


def run_set(root: Path, args) -> dict:
    fps = vla_io.DatasetMeta(root).fps
    started = time.perf_counter()
    ds = CountingDataset(
        root, delta_timestamps={"action": [i / fps for i in range(CHUNK)]}, video_backend=args.decoder,
        max_open_videos=args.max_open_videos, progress=False,
    )  # fmt: skip
    dataset_open_s = time.perf_counter() - started
    recorder = Recorder()
    pipe = Pipeline(
        ds, args.batch_size, transform=recorder, device_transform=make_augment(ds.video_keys, args),
        num_workers=args.workers, seed=args.seed, device=args.device,
    )  # fmt: skip
    ticks, delivered, first_batch_s = [], 0, None
    started = time.perf_counter()
    next_tick = started
    batches = _forever(pipe)
    try:
        while True:
            batch = next(batches)
            delivered += args.batch_size
            now = time.perf_counter()
            if first_batch_s is None:
                first_batch_s = now - started
            if now >= next_tick or now - started >= 60 * args.minutes:
                pool = pipe._producer._pool if pipe._producer is not None else None
                pids = [p.pid for p in pool._procs] if pool is not None else []
                ticks.append(
                    {
                        "t": now - started, "samples": delivered, "main": {**proc_memory("self"), **proc_files("self")},
                        "workers": {pid: {**proc_memory(pid), **proc_files(pid)} for pid in pids},
                        "readers": recorder.snapshot(),
                    }
                )  # fmt: skip
                next_tick = now + args.interval
                if now - started >= 60 * args.minutes:
                    break
        if args.device.startswith("cuda"):
            torch.cuda.synchronize()
        shape = tuple(batch["images" if "images" in batch else ds.video_keys[0]].shape)
        stats = pipe.stats()
        affinity = getattr(pipe._producer, "routed_by_affinity", None)
    finally:
        pipe.close()
    return summarize(ds, ticks, args) | {
        "dataset_open_s": dataset_open_s, "first_batch_s": first_batch_s, "batch_shape": shape,
        "pipeline_stats": stats, "affinity": affinity, "ticks": ticks,
    }  # fmt: skip


def summarize(ds: LeRobotDataset, ticks: list[dict], args) -> dict:
    """Steady rate after --warmup, memory trend, and reader opens against samples."""
    steady = [t for t in ticks if t["t"] >= args.warmup] or ticks[-1:]
    first, last = steady[0], ticks[-1]
    rate = (last["samples"] - first["samples"]) / max(last["t"] - first["t"], 1e-9)

    def total(tick, field):
        return tick["main"].get(field, 0.0) + sum(w.get(field, 0.0) for w in tick["workers"].values())

    times = np.array([t["t"] for t in steady]) / 60
    pss = np.array([total(t, "Pss") for t in steady])
    slope = float(np.polyfit(times, pss, 1)[0]) if len(steady) >= 3 else None
    files = {str(ep.videos[k].path) for ep in ds.meta.episodes for k in ds.video_keys}
    readers = last["readers"]
    opened = sum(w["opened"] for w in readers.values())
    samples = sum(w["samples"] for w in readers.values())
    return {
        "samples_per_s": rate if len(steady) > 1 else None,
        "steady_window_s": last["t"] - first["t"],
        "samples": last["samples"],
        "target_samples_per_s": TARGET_SAMPLES_PER_S,
        "meets_target": rate >= TARGET_SAMPLES_PER_S if len(steady) > 1 else None,
        "video_files_in_dataset": len(files),
        "pss_mib_total_start": float(pss[0]), "pss_mib_total_end": float(pss[-1]),
        "pss_mib_per_minute": slope,
        "rss_mib_main_end": last["main"].get("VmRSS"),
        "rss_mib_workers_end": [w.get("VmRSS") for w in last["workers"].values()],
        "max_open_decoders_per_worker": max((w["max_open"] for w in readers.values()), default=0),
        "max_open_video_fds_per_worker": max(
            (w["video_files"] for t in ticks for w in t["workers"].values()), default=0
        ),
        "max_fds_per_worker": max((w["fds"] for t in ticks for w in t["workers"].values()), default=0),
        "reader_opens": opened,
        "reader_evictions": sum(w["evicted"] for w in readers.values()),
        "samples_loaded_by_workers": samples,
        "opens_per_sample": opened / max(samples, 1),
        "reopened": opened > len(files) * max(len(readers), 1),  # more opens than (files x workers)
    }  # fmt: skip


def _forever(pipe):
    while True:
        yield from pipe


def main(argv=None) -> int:
    args = parse_args(argv)
    torch.set_num_threads(1)
    names = [s.strip() for s in args.sets.split(",") if s.strip()]
    made = {name: make_set(args, name) for name in names}  # all written first: no fork after CUDA starts
    results = {}
    for name in names:
        root, made_s = made[name]
        written = f"written in {made_s:.1f} s" if made_s is not None else "existing"
        print(f"{name}: {root} ({written})", file=sys.stderr)
        results[name] = {"root": str(root), "synth_s": made_s, **describe_files(root), **run_set(root, args)}
        r = results[name]
        print(
            f"{name:>5}: {r['samples_per_s'] or float('nan'):8.1f} samples/s (steady {r['steady_window_s']:.0f} s),"
            f" {r['video_files']} video files (max {r['video_file_mib_max']:.0f} MiB), {r['data_files']} data"
            f" files (max {r['data_file_mib_max']:.0f} MiB); per worker: <= {r['max_open_decoders_per_worker']}"
            f" decoders, <= {r['max_open_video_fds_per_worker']} open mp4, {r['max_fds_per_worker']} fds;"
            f" reader opens {r['reader_opens']} for {r['samples_loaded_by_workers']} samples"
            f" ({r['reader_evictions']} evicted); PSS {r['pss_mib_total_start']:.0f} -> "
            f"{r['pss_mib_total_end']:.0f} MiB ({r['pss_mib_per_minute'] or 0:+.1f} MiB/min)"
        )
    if args.json:
        record = {
            "benchmark": "io_scale",
            "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
            "host": platform.node(), "cpus": os.cpu_count(), "torch": torch.__version__,
            "vla_io": vla_io.__version__,
            "gpu": torch.cuda.get_device_name() if torch.cuda.is_available() else None,
            "args": vars(args), "results": results,
        }  # fmt: skip
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(record, indent=2, default=str) + "\n")
        print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
