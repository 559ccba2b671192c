"""data.prefix_cache against the full stack: samples/s of training from stored frozen-prefix features next to
training from video, for the release's trainable set (top 4 LLM layers + vlln + action head) and for the
action head alone, with the cache's build time and size.

Each variant is one `gr00t-train train --preset libero` process (n1.6-3b, batch 16, every speed switch at its
default) on the same small synthetic LIBERO-like dataset, so the cache builds in seconds:

    full            the plain run: video decoded, frozen prefix computed every step
    cached          data.prefix_cache.mode=disk into a fresh folder: the build is timed, then training
    full-head       model.tune_top_llm_layers=0 (the action head and vlln train; the LLM is frozen)
    cached-head     the same from a cache of the whole backbone's output
    full-moments8   full and cached with block-wise 8-bit AdamW moments (memory.adam_moments=int8, which live
    cached-moments8 in ZeRO-1's optimizer): fewer update bytes for a step that is about half update (on an
                    H100 the cached step was slower with them: BENCHMARKS.md, "Levers tried")

    source benchmarks/gpu_env.sh
    python benchmarks/prefix_cache.py --json benchmarks/results/prefix_cache_h200_<date>.json

It prints a table and writes JSON (summary.json facts of every run). About 5 minutes on an H200 (each run
compiles its blocks). A CPU check: --synthetic-size tiny --set model.preset=tiny --set device=cpu
--set data.batch_size=4 --set data.num_workers=1 --steps 4 --warmup 1.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import time
from pathlib import Path

import _train_runs

VARIANTS = {
    "full": [],
    "cached": ["data.prefix_cache.mode=disk"],
    "full-head": ["model.tune_top_llm_layers=0"],
    "cached-head": ["model.tune_top_llm_layers=0", "data.prefix_cache.mode=disk"],
    "full-moments8": ["memory.adam_moments=int8", "optimizations.comm=zero1_overlap"],
    "cached-moments8": [
        "memory.adam_moments=int8",
        "optimizations.comm=zero1_overlap",
        "data.prefix_cache.mode=disk",
    ],
}
DEFAULT_VARIANTS = "full,cached,full-head,cached-head"
QUIET = [*_train_runs.QUIET, "eval.every=0", "data.val_episodes=0"]
SYNTHETIC = {
    "small": {"episodes": 6, "episode_length": 80},  # about 430 samples: the cache builds in seconds
    "tiny": {"episodes": 2, "episode_length": 16, "image_size": 64, "codec": "h264"},  # the CPU check
}


def parse() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument(
        "--dataset", type=Path, help="a LeRobot dataset (default: a synthetic one written to --out)"
    )
    p.add_argument("--synthetic-size", choices=sorted(SYNTHETIC), default="small")
    p.add_argument("--steps", type=int, default=80)
    p.add_argument("--warmup", type=int, default=10, help="leading steps left out of samples/s")
    p.add_argument("--variants", default=DEFAULT_VARIANTS, help=f"any of {','.join(VARIANTS)}")
    p.add_argument("--out", type=Path, default=Path("/tmp/prefix_cache_bench"))
    p.add_argument("--json", type=Path)
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                   help="more settings for every variant")  # fmt: skip
    return p.parse_args()


def dataset(args: argparse.Namespace) -> tuple[Path, float]:
    """The dataset to train on and the seconds it took to write (0 when given)."""
    if args.dataset is not None:
        return args.dataset, 0.0
    import vla_io

    root = args.out / f"dataset-{args.synthetic_size}"
    started = time.perf_counter()
    if not (root / "meta" / "info.json").is_file():
        vla_io.write_synthetic_dataset(root, vla_io.testing.SynthConfig(**SYNTHETIC[args.synthetic_size]))
    return root, time.perf_counter() - started


def train(args: argparse.Namespace, name: str, data: Path) -> dict:
    out = args.out / name
    sets = [f"data.dataset={data}", f"output_dir={out}", f"steps={args.steps}",
            f"logging.summary_skip={args.warmup}", *QUIET, *VARIANTS[name], *args.overrides]  # fmt: skip
    if "data.prefix_cache.mode=disk" in sets:
        cache = args.out / f"cache-{name}"
        shutil.rmtree(cache, ignore_errors=True)  # a fresh build is what gets timed
        sets.append(f"data.prefix_cache.dir={cache}")
    cmd = [sys.executable, "-m", "gr00t_train", "train", "--preset", "libero"]
    for item in sets:
        cmd += ["--set", item]
    started = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        raise SystemExit(f"{name} failed ({proc.returncode}):\n{proc.stderr[-4000:]}")
    summary = json.loads((out / "summary.json").read_text())
    cache = summary.get("prefix_cache") or {}
    return {
        "variant": name,
        "settings": VARIANTS[name],
        "samples_per_s": summary["samples_per_s"],
        "step_ms": 1000 * summary["step_time_s"],
        "mfu": summary.get("mfu"),
        "first_step_s": summary.get("first_step_s"),
        "startup_s": summary.get("startup_s"),
        "peak_memory_gib": summary.get("peak_memory_gib"),
        "cache_build_s": cache.get("build_s"),
        "cache_build_first_batch_s": cache.get("first_batch_s"),  # workers' start and compilation
        "cache_fingerprint_s": cache.get("fingerprint_s"),
        "cache_bytes": cache.get("bytes"),
        "cache_samples": cache.get("samples"),
        "cache_frozen_llm_layers": cache.get("frozen_llm_layers"),
        "process_s": time.perf_counter() - started,
    }


def main() -> None:
    args = parse()
    args.out.mkdir(parents=True, exist_ok=True)
    data, written_s = dataset(args)
    rows = []
    for name in args.variants.split(","):
        rows.append(train(args, name, data))
        print(json.dumps(rows[-1]), flush=True)
    by = {r["variant"]: r for r in rows}
    speedups = {
        label: by[cached]["samples_per_s"] / by[full]["samples_per_s"]
        for label, cached, full in (
            ("release", "cached", "full"),
            ("action_head_only", "cached-head", "full-head"),
            ("release_moments8", "cached-moments8", "full-moments8"),
        )
        if cached in by and full in by
    }
    print(
        f"\n{'variant':<15} {'samples/s':>10} {'step ms':>8} {'build s':>8} {'cache GB':>9} {'startup s':>10}"
    )
    for r in rows:
        build = f"{r['cache_build_s']:.1f}" if r["cache_build_s"] is not None else "-"
        size = f"{r['cache_bytes'] / 1e9:.2f}" if r["cache_bytes"] is not None else "-"
        print(f"{r['variant']:<15} {r['samples_per_s']:>10.1f} {r['step_ms']:>8.2f} {build:>8} {size:>9} "
              f"{r['startup_s'] or 0:>10.1f}")  # fmt: skip
    for label, value in speedups.items():
        print(f"speed-up {label}: {value:.2f}x")
    if args.json:
        import torch

        device = torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu"
        report = {"date": time.strftime("%Y-%m-%d"), "device": device, "torch": torch.__version__,
                  "dataset": str(data), "dataset_write_s": written_s, "steps": args.steps, "warmup": args.warmup,
                  "overrides": args.overrides, "results": rows, "speedup": speedups,
                  "target_2x_release_met": speedups.get("release", 0.0) >= 2.0}  # fmt: skip
        _train_runs.write_report(args.json, report)


if __name__ == "__main__":
    main()
