"""Samples/s delivered by three loaders on the same dataset, cores and batch size.

(a) naive:     a new decoder per sample that decodes the whole episode, then picks the frame
               (the approach of the official GR00T loader);
(b) per-frame: a new decoder per frame, seeking to it (LeRobot-style, torchcodec approximate mode);
(c) vla-io:    `vla_io.Pipeline` (long-lived decoders per worker and file, sorted batched fetches,
               uint8 in shared memory, a host thread, pinned memory and a copy stream).

(a) and (b) run in a torch DataLoader with the same workers, batch size and random order; all three return
uint8 frames (generous to the baselines), an action chunk of 16 and the state. With --augment each batch is
delivered on --device cropped, resized to 224x224, color-jittered and normalized (both cameras), through
`ImageAugment` (in the pipeline's L3 step for vla-io; after the copy for the baselines).

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
    p.add_argument("--batches", type=int, default=40, help="timed batches for vla-io and per-frame")
    p.add_argument("--naive-batches", type=int, default=6, help="timed batches for the naive loader")
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--reuse-shared-memory", choices=["on", "off"], default="on")
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
        cfg = vla_io.SYNTH_PRESETS["libero"].with_(
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
                return VideoDecoder(path).get_frames_in_range(first, first + length).data[index - first]
            return VideoDecoder(path, seek_mode="approximate").get_frame_at(index).data
        import av

        with av.open(path) as container:
            stream = container.streams.video[0]
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
    return {k: (v.to(device) if isinstance(v, torch.Tensor) else v) for k, v in batch.items()}


def sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def run_baseline(root, mode, args, fps) -> dict:
    ds = BaselineDataset(root, mode, args.decoder, fps)
    augment = make_augment(ds.keys, args)
    sampler = torch.utils.data.RandomSampler(ds, generator=torch.Generator().manual_seed(args.seed))
    loader = torch.utils.data.DataLoader(
        ds, batch_size=args.batch_size, sampler=sampler, num_workers=args.workers, drop_last=True,
        persistent_workers=args.workers > 0, prefetch_factor=2 if args.workers else None,
    )  # fmt: skip
    count = args.naive_batches if mode == "naive" else args.batches
    it = iter(loader)
    for _ in range(args.warmup):
        next(it)
    pids = [w.pid for w in getattr(it, "_workers", [])]
    cpu = cpu_seconds(pids)
    start = time.perf_counter()
    for _ in range(count):
        batch = to_device(next(it), args.device)
        if augment is not None:
            batch["sample_seed"] = torch.arange(args.batch_size)
            batch = augment(batch)
    sync(args.device)
    elapsed = time.perf_counter() - start
    cpu = cpu_seconds(pids) - cpu
    n = count * args.batch_size
    return {
        "batches": count,
        "seconds": elapsed,
        "samples_per_s": n / elapsed,
        "cpu_ms_per_sample": 1e3 * cpu / n,
    }


def run_vla_io(root, args, fps) -> dict:
    ds = LeRobotDataset(
        root, delta_timestamps={"action": [i / fps for i in range(CHUNK)]}, video_backend=args.decoder,
        decode_device=args.decode_device, progress=False,
    )  # fmt: skip
    augment = make_augment(ds.video_keys, args)
    extra = {"start_method": "spawn"} if args.decode_device != "cpu" else {}
    pipe = Pipeline(
        ds,
        args.batch_size,
        num_workers=args.workers,
        seed=args.seed,
        device=args.device,
        device_transform=augment,
        reuse_shared_memory=args.reuse_shared_memory == "on",
        **extra,
    )
    stream = iter(_forever(pipe))
    for _ in range(args.warmup):
        next(stream)
    pipe.reset_stats()
    pool = pipe._producer._pool if pipe._producer is not None else None
    pids = [p.pid for p in pool._procs] if pool is not None else []
    cpu = cpu_seconds(pids)
    start = time.perf_counter()
    for _ in range(args.batches):
        batch = next(stream)
    sync(args.device)
    elapsed = time.perf_counter() - start
    cpu = cpu_seconds(pids) - cpu
    stats = pipe.stats()
    pipe.close()
    images = batch["images"] if "images" in batch else batch[ds.video_keys[0]]
    shape = tuple(images.shape)
    n = args.batches * args.batch_size
    return {
        "batches": args.batches,
        "seconds": elapsed,
        "samples_per_s": n / elapsed,
        "cpu_ms_per_sample": 1e3 * cpu / n,
        "stats": stats,
        "image_batch_shape": shape,
        "image_batch": f"{images.dtype} on {images.device}",
    }


def median_run(runs: list[dict]) -> dict:
    """The run with the median throughput, plus every run's samples/s and CPU ms/sample."""
    ordered = sorted(runs, key=lambda r: r["samples_per_s"])
    out = dict(ordered[len(ordered) // 2])
    out["all_samples_per_s"] = [r["samples_per_s"] for r in runs]
    out["all_cpu_ms_per_sample"] = [r["cpu_ms_per_sample"] for r in runs]
    out["median_cpu_ms_per_sample"] = float(np.median(out["all_cpu_ms_per_sample"]))
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
    print(f"\n{meta.version} {args.codec if not args.dataset else ''} {root}")
    print(f"batch {args.batch_size}, workers {args.workers}, decoder {args.decoder}/{args.decode_device}, delivered to {args.device}"
          f"{' augmented+normalized 224x224' if args.augment else ' (uint8 frames)'}, {os.cpu_count()} CPUs visible")  # fmt: skip
    if args.repeat > 1:
        print(f"medians of {args.repeat} interleaved runs")
    print(f"{'loader':<36}{'samples/s':>11}{'frames/s':>10}{'vs (a)':>8}{'vs (b)':>8}{'CPU ms/sample':>15}")
    for mode, r in results.items():
        rel = [
            f"{r['samples_per_s'] / results[m]['samples_per_s']:.1f}x" if m in results else "-" for m in "ab"
        ]
        rate = r["samples_per_s"]
        cpu = r["median_cpu_ms_per_sample"]
        print(
            f"({mode}) {names[mode]:<32}{rate:>11.1f}{rate * cams:>10.1f}{rel[0]:>8}{rel[1]:>8}{cpu:>15.1f}"
        )
    if "c" in results:
        s = results["c"]["stats"]
        print(f"vla-io waits per batch: L1 {s['l1_wait_ms']:.1f} ms, L2 {s['l2_wait_ms']:.1f} ms, L3 (consumer) {s['l3_wait_ms']:.1f} ms; "
              f"device step {s['device_ms']:.1f} ms")  # fmt: skip
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
