"""Samples/s delivered by three loaders on the same dataset, cores and batch size, in steady state.

(a) naive:     a new decoder per sample that decodes the whole episode, then picks the frame
               (the approach of the official GR00T loader);
(b) per-frame: a new decoder per frame, seeking to it (LeRobot-style, torchcodec approximate mode);
(c) vla-io:    `vla_io.Pipeline` (long-lived decoders per worker and file, sorted batched fetches,
               uint8 in reused shared memory, a host thread, pinned memory and a copy stream).

(a) and (b) run in a torch DataLoader with the same workers, batch size and random order (pinned memory
when delivering to CUDA); all three return uint8 frames (generous to the baselines), an action chunk of 16
and the state. Every worker process of every loader runs one torch thread and one FFmpeg thread. With
--augment each batch is delivered on --device cropped, resized to 224x224, color-jittered and normalized
(both cameras), through `ImageAugment` (in the pipeline's L3 step for vla-io; after the copy for the
baselines).

Each loader is timed by the clock: its first epoch from its creation, at most --warmup seconds (worker
start, first decoder opens: the start-up rate), then --seconds of steady state (the headline rate, CPU
ms/sample over the main process and its workers, and the cores they kept busy).

    python benchmarks/io_throughput.py --workers 2 --json benchmarks/results/io_throughput_cpu.json
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

import numpy as np
import torch
import vla_io
from vla_io import ImageAugment, ImageTransformConfig, LeRobotDataset, Pipeline
from vla_io.decode import FrameCache

CHUNK = 16


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument(
        "--dataset", help="a LeRobot dataset; default: the LIBERO-like synthetic preset, made on first use"
    )
    p.add_argument("--synth-dir", default="/tmp/vla_io_bench", help="where the synthetic dataset is written")
    p.add_argument("--episodes", type=int, default=20)
    p.add_argument("--length", type=int, default=200)
    p.add_argument("--image-size", type=int, default=256)
    p.add_argument("--version", choices=["v2.1", "v3.0"], default="v2.1")
    p.add_argument("--codec", choices=["av1", "h264"], default="av1")
    p.add_argument("--batch-size", type=int, default=16)
    p.add_argument("--workers", type=int, default=2, help="worker processes for every loader")
    p.add_argument("--device", default="cpu", help="where batches are delivered: cpu or cuda")
    p.add_argument("--decoder", choices=["torchcodec", "pyav"], default="torchcodec")
    p.add_argument(
        "--decode-device", default="cpu", help="vla-io decoding: cpu, or cuda (NVDEC, torchcodec only)"
    )
    p.add_argument("--augment", action="store_true", help="deliver augmented, normalized 224x224 images")
    p.add_argument("--augment-backend", choices=["torch", "dali"], default="torch")
    p.add_argument("--modes", default="a,b,c", help="which loaders to run: a, b, c")
    p.add_argument("--seconds", type=float, default=20.0, help="steady-state window per loader")
    p.add_argument(
        "--warmup",
        type=float,
        default=10.0,
        help="start-up window: the first epoch, at most this many seconds",
    )
    p.add_argument(
        "--naive-seconds", type=float, default=None, help="steady window for (a) (default: --seconds)"
    )
    p.add_argument("--reuse-shared-memory", choices=["on", "off"], default="on")
    p.add_argument(
        "--pin-shared-memory",
        choices=["on", "off"],
        default="on",
        help="vla-io on CUDA: copy from page-locked worker memory (on) or through a staging copy (off)",
    )
    p.add_argument(
        "--sample-window", type=int, default=1, help="vla-io only: shuffle windows of neighbouring frames"
    )
    p.add_argument(
        "--frame-cache",
        action="store_true",
        help="vla-io only: read frames from the decoded-frame cache (built first, at source size, untimed)",
    )
    p.add_argument("--seed", type=int, default=0)
    p.add_argument(
        "--repeat", type=int, default=1, help="run the loaders in turn this many times; report medians"
    )
    p.add_argument("--json", help="write the results here")
    return p.parse_args(argv)


def dataset_root(args) -> Path:
    if args.dataset:
        return Path(args.dataset)
    name = f"libero-{args.version}-{args.codec}-{args.image_size}px-{args.episodes}x{args.length}"
    root = Path(args.synth_dir) / name
    if not (root / "meta/info.json").exists():
        cfg = vla_io.testing.SYNTH_PRESETS["libero"].with_(
            version=args.version, codec=args.codec, episodes=args.episodes, episode_length=args.length,
            image_size=args.image_size,
        )  # fmt: skip
        vla_io.write_synthetic_dataset(root, cfg, overwrite=True)
    return root


class BaselineDataset(torch.utils.data.Dataset):
    """Rows from vla-io's table (cheap), frames decoded the baseline's way."""

    def __init__(self, root: Path, mode: str, decoder: str, fps: float) -> None:
        self.rows = LeRobotDataset(
            root, video_keys=[], delta_timestamps={"action": [i / fps for i in range(CHUNK)]}, progress=False
        )
        self.meta = self.rows.meta
        self.keys = LeRobotDataset(root, progress=False).video_keys
        self.mode, self.decoder, self.fps = mode, decoder, fps

    def __len__(self) -> int:
        return len(self.rows)

    def _frame(self, path: str, first: int, length: int, index: int) -> torch.Tensor:
        if self.decoder == "torchcodec":
            from torchcodec.decoders import VideoDecoder

            if self.mode == "naive":  # the whole episode, then one frame of it
                decoder = VideoDecoder(path, num_ffmpeg_threads=1)
                return decoder.get_frames_in_range(first, first + length).data[index - first]
            return VideoDecoder(path, seek_mode="approximate", num_ffmpeg_threads=1).get_frame_at(index).data
        import av

        with av.open(path) as container:
            stream = container.streams.video[0]
            stream.codec_context.thread_count = 1
            if self.mode == "naive":
                frames = [f.to_ndarray(format="rgb24") for f in container.decode(stream)][
                    first : first + length
                ]
                return torch.from_numpy(frames[index - first]).permute(2, 0, 1)
            target = int(round(index / self.fps / stream.time_base))
            container.seek(target, stream=stream, backward=True)
            for frame in container.decode(stream):
                if frame.pts >= target:
                    return torch.from_numpy(frame.to_ndarray(format="rgb24")).permute(2, 0, 1)
        raise RuntimeError(f"{path}: frame {index} not found")

    def __getitem__(self, i: int) -> dict:
        sample = self.rows[i]
        ep = self.meta.episode(int(sample["episode_index"]))
        for key in self.keys:
            span = ep.videos[key]
            first = int(round(span.from_timestamp * self.fps))
            sample[key] = self._frame(str(span.path), first, ep.length, first + int(sample["frame_index"]))
        return sample


def make_augment(keys, args):
    if not args.augment:
        return None
    cfg = ImageTransformConfig(
        size=(224, 224), crop_scale=(0.8, 1.0), brightness=0.3, contrast=0.4, saturation=0.5, hue=5,
        mean=(0.5, 0.5, 0.5), std=(0.5, 0.5, 0.5), same_across_views=False,
    )  # fmt: skip
    return ImageAugment(cfg, keys, backend=args.augment_backend, stack_as="images")


def cpu_seconds(pids) -> float:
    """User + system CPU seconds of this process (all threads) and the given child processes."""
    tick = os.sysconf("SC_CLK_TCK")
    total = 0.0
    for pid in ["self", *pids]:
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
            total += (int(fields[11]) + int(fields[12])) / tick
        except (OSError, IndexError):
            pass
    return total


def to_device(batch: dict, device: str) -> dict:
    return {
        k: (v.to(device, non_blocking=True) if isinstance(v, torch.Tensor) else v) for k, v in batch.items()
    }


def sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def _one_thread(_worker: int) -> None:
    torch.set_num_threads(1)  # what vla-io's workers do (DataLoader does it too; explicit for fairness)


def timed(batches, pids, args, steady_s: float, epoch_batches: int) -> dict:
    """Drive an iterator of delivered batches: the first epoch (at most --warmup seconds) from creating the
    loader, then a steady-state window of `steady_s` seconds."""
    created = time.perf_counter()
    batch = next(batches)
    first_batch_s = time.perf_counter() - created
    count = 1
    while count < epoch_batches and time.perf_counter() - created < args.warmup:
        batch = next(batches)
        count += 1
    sync(args.device)
    cold_s = time.perf_counter() - created
    workers = pids()
    cpu = cpu_seconds(workers)
    start = time.perf_counter()
    n = 0
    while n == 0 or time.perf_counter() - start < steady_s:
        batch = next(batches)
        n += 1
    sync(args.device)
    elapsed = time.perf_counter() - start
    cpu = cpu_seconds(workers) - cpu
    samples = n * args.batch_size
    return {
        "first_batch_s": first_batch_s,
        "startup_batches": count,
        "startup_samples_per_s": count * args.batch_size / cold_s,
        "batches": n,
        "seconds": elapsed,
        "samples_per_s": samples / elapsed,
        "cpu_ms_per_sample": 1e3 * cpu / samples,
        "busy_cores": cpu / elapsed,
        "last_batch": batch,
    }


def run_baseline(root, mode, args, fps) -> dict:
    ds = BaselineDataset(root, mode, args.decoder, fps)
    augment = make_augment(ds.keys, args)
    sampler = torch.utils.data.RandomSampler(ds, generator=torch.Generator().manual_seed(args.seed))
    loader = torch.utils.data.DataLoader(
        ds, batch_size=args.batch_size, sampler=sampler, num_workers=args.workers, drop_last=True,
        persistent_workers=args.workers > 0, prefetch_factor=2 if args.workers else None,
        pin_memory=args.device.startswith("cuda"), worker_init_fn=_one_thread,
    )  # fmt: skip

    def delivered():
        while True:
            for batch in loader:
                batch = to_device(batch, args.device)
                if augment is not None:
                    batch["sample_seed"] = torch.arange(args.batch_size)
                    batch = augment(batch)
                yield batch

    batches = delivered()
    steady = args.naive_seconds if mode == "naive" and args.naive_seconds else args.seconds
    pids = lambda: [w.pid for w in getattr(loader._iterator, "_workers", [])]  # noqa: E731
    out = timed(batches, pids, args, steady, len(loader))
    out.pop("last_batch")
    batches.close()
    return out


def run_vla_io(root, args, fps) -> dict:
    ds = LeRobotDataset(
        root, delta_timestamps={"action": [i / fps for i in range(CHUNK)]}, video_backend=args.decoder,
        decode_device=args.decode_device, progress=False,
    )  # fmt: skip
    cache_build_s = None
    if args.frame_cache:  # same frames, same augmentation; only the decoding is replaced by a read
        started = time.perf_counter()
        try:
            cache = FrameCache.open(ds)
        except FileNotFoundError:
            cache = FrameCache.build(ds, progress=False)
        cache.attach(ds)
        cache_build_s = time.perf_counter() - started
    augment = make_augment(ds.video_keys, args)
    extra = {"start_method": "spawn"} if args.decode_device != "cpu" else {}
    if args.sample_window > 1:
        extra["sample_window"] = args.sample_window
    pipe = Pipeline(
        ds,
        args.batch_size,
        num_workers=args.workers,
        seed=args.seed,
        device=args.device,
        device_transform=augment,
        reuse_shared_memory=args.reuse_shared_memory == "on",
        pin_shared_memory=args.pin_shared_memory == "on",
        **extra,
    )

    def pids():
        pipe.reset_stats()  # the steady window starts now
        pool = pipe._producer._pool if pipe._producer is not None else None
        return [p.pid for p in pool._procs] if pool is not None else []

    out = timed(_forever(pipe), pids, args, args.seconds, len(pipe))
    batch = out.pop("last_batch")
    out["stats"] = pipe.stats()
    if cache_build_s is not None:
        out["frame_cache_open_or_build_s"] = cache_build_s
    out["affinity"] = getattr(pipe._producer, "routed_by_affinity", None)
    if pipe._producer is not None:  # direct copies from page-locked worker memory, or why not
        out["pinned_arenas"] = len(pipe._producer.h2d._pinned)
        out["pin_failed"] = pipe._producer.h2d.pin_failed
    pipe.close()
    images = batch["images"] if "images" in batch else batch[ds.video_keys[0]]
    out["image_batch_shape"] = tuple(images.shape)
    out["image_batch"] = f"{images.dtype} on {images.device}"
    return out


def median_run(runs: list[dict]) -> dict:
    """The run with the median steady throughput, plus every run's rates and CPU ms/sample."""
    ordered = sorted(runs, key=lambda r: r["samples_per_s"])
    out = dict(ordered[len(ordered) // 2])
    for key in ("samples_per_s", "startup_samples_per_s", "cpu_ms_per_sample"):
        out[f"all_{key}"] = [r[key] for r in runs]
    out["median_cpu_ms_per_sample"] = float(np.median(out["all_cpu_ms_per_sample"]))
    out["median_startup_samples_per_s"] = float(np.median(out["all_startup_samples_per_s"]))
    return out


def _forever(pipe):
    while True:
        yield from pipe


def main(argv=None) -> int:
    args = parse_args(argv)
    torch.set_num_threads(1)
    root = dataset_root(args)
    meta = vla_io.DatasetMeta(root)
    fps = meta.fps
    modes = [m.strip() for m in args.modes.split(",") if m.strip()]
    names = {"a": "naive (whole episode per sample)", "b": "new decoder per frame", "c": "vla-io Pipeline"}
    runs: dict[str, list[dict]] = {m: [] for m in modes}
    for rep in range(args.repeat):  # interleaved, so a busy spell on a shared machine hits every loader
        for mode in modes:
            print(f"run {rep + 1}/{args.repeat}: ({mode}) {names[mode]} ...", file=sys.stderr, flush=True)
            if mode == "a":
                runs["a"].append(run_baseline(root, "naive", args, fps))
            elif mode == "b":
                runs["b"].append(run_baseline(root, "per_frame", args, fps))
            elif mode == "c":
                runs["c"].append(run_vla_io(root, args, fps))
    results = {m: median_run(r) for m, r in runs.items()}
    cams = len([k for k, f in meta.features.items() if f.get("dtype") == "video"])
    frames = sum(e.length for e in meta.episodes)
    print(f"\n{meta.version} {args.codec if not args.dataset else ''} {root}: {len(meta.episodes)} episodes, "
          f"{frames} frames, {cams} cameras")  # fmt: skip
    print(f"batch {args.batch_size}, workers {args.workers}, decoder {args.decoder}/{args.decode_device}, delivered to {args.device}"
          f"{' augmented+normalized 224x224' if args.augment else ' (uint8 frames)'}, {os.cpu_count()} CPUs visible"
          f"{f', vla-io sample window {args.sample_window}' if args.sample_window > 1 else ''}"
          f"{', vla-io frames from the decoded-frame cache' if args.frame_cache else ''}")  # fmt: skip
    if args.repeat > 1:
        print(f"medians of {args.repeat} interleaved runs")
    print(
        f"{'loader':<34}{'start-up':>10}{'steady':>10}{'frames/s':>10}{'vs (a)':>8}{'vs (b)':>8}"
        f"{'CPU ms/sample':>15}{'busy cores':>12}"
    )
    for mode, r in results.items():
        rel = [
            f"{r['samples_per_s'] / results[m]['samples_per_s']:.1f}x" if m in results else "-" for m in "ab"
        ]
        rate = r["samples_per_s"]
        print(
            f"({mode}) {names[mode]:<30}{r['median_startup_samples_per_s']:>10.1f}{rate:>10.1f}"
            f"{rate * cams:>10.1f}{rel[0]:>8}{rel[1]:>8}{r['median_cpu_ms_per_sample']:>15.2f}"
            f"{r['busy_cores']:>12.1f}"
        )
    print(f"(samples/s; start-up: the first epoch from creating the loader, at most {args.warmup:g} s; "
          f"steady: the next {args.seconds:g} s)")  # fmt: skip
    if "c" in results:
        s = results["c"]["stats"]
        print(f"vla-io waits per batch: L1 {s['l1_wait_ms']:.1f} ms, L2 {s['l2_wait_ms']:.1f} ms, L3 (consumer) {s['l3_wait_ms']:.1f} ms; "
              f"device step {s['device_ms']:.1f} ms; episode affinity {'on' if results['c']['affinity'] else 'off'}")  # fmt: skip
    if args.json:
        record = {
            "benchmark": "io_throughput",
            "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
            "host": platform.node(),
            "cpus": os.cpu_count(),
            "torch": torch.__version__,
            "vla_io": vla_io.__version__,
            "gpu": torch.cuda.get_device_name() if torch.cuda.is_available() else None,
            "args": vars(args),
            "dataset": str(root),
            "cameras": cams,
            "results": results,
        }
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(record, indent=2, default=str) + "\n")
        print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
