"""Samples/s of a data.mixture run next to the single-dataset run: the same model, batch and settings (all
defaults: n1.6-3b, batch 16), one `gr00t-train train` process per row.

Rows:
- single: one LIBERO-like dataset (two 256x256 cameras, 8-d state, 7-d action, libero_panda);
- mixture: three datasets of two embodiments, weights 2:1:1 (that dataset; a second libero_panda dataset in
  the v3.0 layout with other content and statistics; a gr1-like dataset with 24-d state, 16-d action and
  cameras of the same size), so batches mix embodiments;
- mixture-sizes (`--sizes-row`): the same, the gr1-like dataset's first camera 256x320: frames are padded to a
  canvas in the workers and the device image step runs once per dataset.
The datasets are synthetic (H.264, written once under `--data`); compile caches are shared by the rows (the
first row starts cold). Each row's samples/s is the run's steady-state rate (summary.json, after
logging.summary_skip steps); the data wait's share of the step says whether the pipeline keeps up.

    python benchmarks/mixture.py --json benchmarks/results/mixture_h200_<date>.json

On a CPU, to check it: `--set model.preset=tiny --set data.num_workers=1 --steps 8 --image-size 64
--episodes 3 --length 24`.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path


def parse() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument(
        "--data", type=Path, default=Path("/tmp/mixture_bench"), help="where the datasets are written"
    )
    p.add_argument("--out", type=Path, default=Path("/tmp/mixture_runs"))
    p.add_argument("--steps", type=int, default=60)
    p.add_argument("--episodes", type=int, default=8)
    p.add_argument("--length", type=int, default=100, help="frames per episode")
    p.add_argument("--image-size", type=int, default=256)
    p.add_argument("--sizes-row", action="store_true", help="add the row with cameras of other sizes")
    p.add_argument("--json", type=Path)
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE")
    return p.parse_args()


def write_datasets(args: argparse.Namespace) -> dict[str, Path]:
    """The synthetic datasets of the rows (kept: a second run reuses them)."""
    import vla_io
    from vla_io.testing import SynthConfig

    size = args.image_size
    base = SynthConfig(episodes=args.episodes, episode_length=args.length, image_size=size, codec="h264")
    configs = {
        "libero_a": base,
        "libero_b": base.with_(version="v3.0", seed=2),
        "humanoid": base.with_(state_dim=24, action_dim=16, seed=1),
        "humanoid_sizes": base.with_(
            state_dim=24, action_dim=16, seed=1, camera_sizes=((size, size * 5 // 4), (size, size))
        ),
    }
    roots = {}
    for name, config in configs.items():
        root = args.data / f"{name}-{size}-{args.episodes}x{args.length}"
        if not (root / "meta" / "info.json").is_file():
            vla_io.write_synthetic_dataset(root, config, overwrite=True, progress=False)
        roots[name] = root
    return roots


def mixture_toml(roots: dict[str, Path], humanoid: str) -> str:
    """The data.mixture section of the mixture rows."""
    entries = [("libero_a", 2.0, "libero_panda"), ("libero_b", 1.0, "libero_panda"), (humanoid, 1.0, "gr1")]
    return "".join(
        f'\n[[data.mixture]]\ndataset = "{roots[name]}"\nweight = {weight}\nembodiment_tag = "{tag}"\n'
        f'cameras = ["image", "wrist_image"]\nname = "{name}"\n'
        for name, weight, tag in entries
    )


def run_row(args: argparse.Namespace, name: str, config: Path | None, sets: list[str]) -> dict:
    """One `gr00t-train train` process; its summary.json's throughput and the wall time."""
    out = args.out / name
    argv = [sys.executable, "-m", "gr00t_train", "train", "--overwrite"]
    if config is not None:
        argv += ["--config", str(config)]
    for item in (f"steps={args.steps}", f"output_dir={out}", "logging.progress=false", "checkpoint.save_final=false",
                 "eval.every=0", *sets, *args.overrides):  # fmt: skip
        argv += ["--set", item]
    env = {
        **os.environ,
        "TORCHINDUCTOR_CACHE_DIR": str(args.out / "caches" / "inductor"),
        "TRITON_CACHE_DIR": str(args.out / "caches" / "triton"),
    }
    started = time.perf_counter()
    proc = subprocess.run(argv, env=env, capture_output=True, text=True)
    wall = time.perf_counter() - started
    if proc.returncode != 0:
        raise SystemExit(f"row {name} failed ({proc.returncode}):\n{proc.stderr[-4000:]}")
    summary = json.loads((out / "summary.json").read_text())
    step = summary["step_time_s"]
    wait = summary["breakdown_s"].get("data_wait", 0.0)
    return {
        "row": name,
        "samples_per_s": summary["samples_per_s"],
        "step_time_ms": 1000 * step,
        "data_wait_share": wait / step if step else None,
        "mfu": summary.get("mfu"),
        "startup_s": summary.get("startup_s"),
        "wall_s": wall,
        "mixture": summary.get("mixture"),
    }


def main() -> None:
    args = parse()
    args.out.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    roots = write_datasets(args)
    print(f"datasets ready in {time.perf_counter() - started:.1f} s under {args.data}", flush=True)
    single = [
        f"data.dataset={roots['libero_a']}",
        "data.cameras=image,wrist_image",
        "data.embodiment_tag=libero_panda",
    ]
    rows = [run_row(args, "single", None, single)]
    variants = [("mixture", "humanoid")] + ([("mixture-sizes", "humanoid_sizes")] if args.sizes_row else [])
    for name, humanoid in variants:
        config = args.out / f"{name}.toml"
        config.write_text(mixture_toml(roots, humanoid))
        rows.append(run_row(args, name, config, []))
    reference = rows[0]["samples_per_s"]
    print(
        f"{'row':<14} {'samples/s':>10} {'vs single':>10} {'step ms':>9} {'data wait':>10} {'start-up s':>11}"
    )
    for row in rows:
        share = row["data_wait_share"]
        print(
            f"{row['row']:<14} {row['samples_per_s']:>10.1f} {row['samples_per_s'] / reference:>9.1%} "
            f"{row['step_time_ms']:>9.1f} {'' if share is None else f'{share:.1%}':>10} {row['startup_s'] or 0:>11.1f}"
        )
    result = {
        "benchmark": "mixture",
        "steps": args.steps,
        "overrides": args.overrides,
        "datasets": {name: str(root) for name, root in roots.items()},
        "rows": rows,
        "total_s": time.perf_counter() - started,
    }
    print(f"total {result['total_s']:.0f} s")
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(result, indent=2) + "\n")
        print(f"wrote {args.json}")


if __name__ == "__main__":
    main()
