"""torch vs DALI for the trainer's device image step: GPU ms per batch of 16 samples x 2 cameras, and the
samples/s of the whole vla-io pipeline with each backend, on the same data, device and settings.

The step is the one gr00t-train runs (`data.augment_backend`), with the release's settings: per camera a
letterbox to a square, a crop of 0.95 of each side at a random place (the same for both cameras of a
sample), a resize to 252x252, color jitter 0.1 (brightness, contrast, saturation, hue), normalization, the
cameras stacked. Camera sizes are configurable (`--sizes`, one configuration per argument): LIBERO's
two 256x256 cameras, and a 480x640 camera next to a 256x256 one.

Measured, per configuration and backend:
- step: `ImageAugment` on uint8 frames already on the device, `--iters` calls after `--warmup` calls;
  GPU ms per batch from CUDA events around each call on the current stream (on CPU: wall ms), and the
  host ms the call takes (what the pipeline's copy thread spends per batch);
- pipeline: `vla_io.Pipeline` over a synthetic dataset with those cameras (AV1, written once under
  --synth-dir), `--workers` decoding workers, the step as its device transform, samples/s over `--seconds`
  after `--pipeline-warmup` batches; `--repeat` runs interleaved, medians reported.

The rule `auto` follows (vla_io.augment.backend_choice.MEASURED_FASTER): on a device, DALI is recorded as faster
when, in every configuration, its GPU ms per batch is lower than torch's by more than 5% and its pipeline
samples/s is not lower by more than 5%; otherwise torch (which needs nothing beyond torch). The script
prints the verdict and the line to put in MEASURED_FASTER; record the table in BENCHMARKS.md.

    python benchmarks/augment_backends.py --device cuda --workers 12 --json benchmarks/results/augment_backends_h200.json
    python benchmarks/augment_backends.py --device cpu --iters 5 --seconds 5 --repeat 1   # a smoke run
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import time
from datetime import datetime, timezone
from pathlib import Path

import torch
import vla_io
from vla_io import ImageAugment, ImageTransformConfig, LeRobotDataset, Pipeline

BACKENDS = ("torch", "dali")
MARGIN = 0.05  # relative difference that counts as faster (or as not slower)


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--sizes", nargs="+", default=["256x256,256x256", "480x640,256x256"],
                   help="camera sizes HxW,HxW per configuration")  # fmt: skip
    p.add_argument("--batch-size", type=int, default=16)
    p.add_argument("--out-size", type=int, default=252, help="the model's image side")
    p.add_argument("--iters", type=int, default=50)
    p.add_argument("--warmup", type=int, default=10)
    p.add_argument("--workers", type=int, default=4, help="pipeline decoding workers")
    p.add_argument("--seconds", type=float, default=15.0, help="steady pipeline window per run")
    p.add_argument("--pipeline-warmup", type=int, default=10, help="pipeline batches before the window")
    p.add_argument("--repeat", type=int, default=2)
    p.add_argument("--episodes", type=int, default=20)
    p.add_argument("--length", type=int, default=100)
    p.add_argument("--synth-dir", default="/tmp/vla_io_bench_augment")
    p.add_argument("--skip-pipeline", action="store_true", help="only time the step")
    p.add_argument("--json", help="write the results here")
    return p.parse_args(argv)


def parse_sizes(text: str) -> list[tuple[int, int]]:
    return [tuple(int(v) for v in item.lower().split("x")) for item in text.split(",")]  # type: ignore[misc]


def release_step(keys: list[str], side: int, backend: str) -> ImageAugment:
    """The device step with gr00t-train's settings (the numbers of gr00t_model.ImageSpec, as gr00t_train.data.dataset.image_transform passes them)."""
    config = ImageTransformConfig(
        size=(side, side), crop_scale=(0.95**2, 0.95**2), letterbox=True, same_across_views=True,
        brightness=0.1, contrast=0.1, saturation=0.1, hue=36.0, mean=(0.5,) * 3, std=(0.5,) * 3,
    )  # fmt: skip
    return ImageAugment(config, keys=keys, backend=backend, stack_as="pixel_values")


def time_step(backend: str, sizes: list[tuple[int, int]], args) -> dict:
    device = torch.device(args.device)
    gen = torch.Generator().manual_seed(0)
    keys = [f"camera{i}" for i in range(len(sizes))]
    batch = {k: torch.randint(0, 256, (args.batch_size, 3, h, w), dtype=torch.uint8, generator=gen).to(device)
             for k, (h, w) in zip(keys, sizes)}  # fmt: skip
    step = release_step(keys, args.out_size, backend)
    cuda = device.type == "cuda"
    gpu, host = [], []
    for i in range(args.warmup + args.iters):
        batch["sample_seed"] = torch.arange(args.batch_size) + i * args.batch_size
        if cuda:
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
        began = time.perf_counter()
        step(batch)
        took = time.perf_counter() - began
        if cuda:
            end.record()
        if i >= args.warmup:
            host.append(took * 1e3)
            if cuda:
                gpu.append((start, end))
    if cuda:
        torch.cuda.synchronize(device)
        device_ms = [s.elapsed_time(e) for s, e in gpu]
    else:
        device_ms = host
    return {
        "device_ms_per_batch": statistics.median(device_ms),
        "device_ms_spread": [min(device_ms), max(device_ms)],
        "host_ms_per_batch": statistics.median(host),
    }


def dataset_for(sizes: list[tuple[int, int]], args) -> Path:
    tag = "-".join(f"{h}x{w}" for h, w in sizes)
    root = Path(args.synth_dir) / f"cams-{tag}-{args.episodes}x{args.length}"
    if not (root / "meta/info.json").exists():
        cfg = vla_io.testing.SynthConfig(
            episodes=args.episodes, episode_length=args.length, cameras=tuple(f"cam{i}" for i in range(len(sizes))),
            camera_sizes=tuple(sizes), modality=False,
        )  # fmt: skip
        vla_io.write_synthetic_dataset(root, cfg, overwrite=True)
    return root


def pipeline_rate(backend: str, root: Path, args) -> float:
    dataset = LeRobotDataset(root, progress=False)
    step = release_step(list(dataset.video_keys), args.out_size, backend)
    with Pipeline(dataset, args.batch_size, device_transform=step, num_workers=args.workers,
                  device=args.device) as pipe:  # fmt: skip
        batches = _forever(pipe)
        for _ in range(args.pipeline_warmup):
            next(batches)
        count, began = 0, time.perf_counter()
        while time.perf_counter() - began < args.seconds:
            batch = next(batches)
            count += 1
        if batch["pixel_values"].is_cuda:
            torch.cuda.synchronize()
        return count * args.batch_size / (time.perf_counter() - began)


def _forever(pipe):
    while True:
        yield from pipe


def verdict(rows: list[dict]) -> str:
    """ "dali" when it is faster on the device step and not slower end to end in every configuration."""
    by_config: dict[str, dict[str, dict]] = {}
    for row in rows:
        by_config.setdefault(row["sizes"], {})[row["backend"]] = row
    for pair in by_config.values():
        if set(pair) != set(BACKENDS):
            return "torch"
        torch_row, dali_row = pair["torch"], pair["dali"]
        if dali_row["device_ms_per_batch"] > (1 - MARGIN) * torch_row["device_ms_per_batch"]:
            return "torch"
        rates = (dali_row.get("pipeline_samples_per_s"), torch_row.get("pipeline_samples_per_s"))
        if None not in rates and rates[0] < (1 - MARGIN) * rates[1]:
            return "torch"
    return "dali"


def main(argv=None) -> int:
    args = parse_args(argv)
    torch.set_num_threads(1)
    from vla_io.augment.dali_backend import dali_error

    backends = [b for b in BACKENDS if b == "torch" or dali_error() is None]
    if len(backends) < 2:
        print(f"DALI cannot be imported here ({dali_error()}); timing torch only, no verdict possible")
    rows = []
    for text in args.sizes:
        sizes = parse_sizes(text)
        root = None if args.skip_pipeline else dataset_for(sizes, args)
        rates: dict[str, list[float]] = {b: [] for b in backends}
        for _ in range(1 if args.skip_pipeline else args.repeat):  # interleaved: drift hits both alike
            for backend in backends:
                if root is not None:
                    rates[backend].append(pipeline_rate(backend, root, args))
        for backend in backends:
            row = {"sizes": text, "backend": backend, **time_step(backend, sizes, args)}
            if rates[backend]:
                row["pipeline_samples_per_s"] = statistics.median(rates[backend])
                row["pipeline_runs"] = rates[backend]
            rows.append(row)
    unit = "GPU" if args.device.startswith("cuda") else "CPU"
    print(
        f"| cameras | backend | {unit} ms / batch of {args.batch_size} | host ms / batch | pipeline samples/s |"
    )
    print("|---|---|---|---|---|")
    for r in rows:
        rate = r.get("pipeline_samples_per_s")
        print(f"| {r['sizes']} | {r['backend']} | {r['device_ms_per_batch']:.2f} | {r['host_ms_per_batch']:.2f} | "
              f"{'-' if rate is None else f'{rate:.1f}'} |")  # fmt: skip
    device_type = torch.device(args.device).type
    faster = verdict(rows) if len(backends) == 2 and not args.skip_pipeline else None
    if faster is None:
        print("\nno verdict: the rule needs both backends and the pipeline rates (without --skip-pipeline)")
    else:
        print(f"\nfaster on {device_type}: {faster}. In vla_io/augment/backend_choice.py: "
              f"MEASURED_FASTER = {{{device_type!r}: {faster!r}}}")  # fmt: skip
    if args.json:
        result = {
            "benchmark": "augment_backends",
            "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
            "host": platform.node(),
            "device": torch.cuda.get_device_name() if device_type == "cuda" else platform.processor(),
            "torch": torch.__version__,
            "vla_io": vla_io.__version__,
            "args": vars(args),
            "rows": rows,
            "faster": faster,
        }
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(result, indent=2) + "\n")
        print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
