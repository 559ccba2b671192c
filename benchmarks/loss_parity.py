"""Loss curves of the techniques that change numbers, against the full-precision path, over the same steps.

Each variant is one `gr00t-train train` process on the same dataset, seed and settings (n1.6-3b, batch 16,
every other setting at its default), differing only in its own `--set`s:

    reference   the default full fine-tune (fp32 masters and moments, bf16 autocast)
    repeat      the reference again: how far two runs of the same settings drift (the noise floor)
    fp8         optimizations.fp8_frozen=true (the frozen prefix's weights in FP8)
    int8        memory.adam_moments=int8 (block-wise 8-bit Adam moments)
    lora32      model.lora.rank=32 (LoRA adapters; a different trainable set, so a different curve)

Per variant: the training loss per step (metrics.jsonl), its mean over windows of `--window` steps, the
largest and mean relative difference of those window means from the reference's, the last window's mean, and
the validation MSE over the mean-action baseline (eval.every). A PNG overlays the curves.

    python -m vla_io synth /tmp/libero --preset libero --episodes 20
    python benchmarks/loss_parity.py --dataset /tmp/libero --json benchmarks/results/loss_parity_h200_<date>.json

`--set model.preset=tiny --set data.num_workers=1 --set optimizations.comm=zero1_overlap --steps 40 --window 10`
checks it on a CPU (8-bit moments live in ZeRO-1, the default on a GPU only).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

from _train_runs import QUIET, write_report

VARIANTS = {
    "reference": [],
    "repeat": [],
    "fp8": ["optimizations.fp8_frozen=true"],
    "int8": ["memory.adam_moments=int8"],
    "lora32": ["model.lora.rank=32"],
}


def parse() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--dataset", type=Path, required=True)
    p.add_argument("--cameras", default="image,wrist_image")
    p.add_argument("--steps", type=int, default=300)
    p.add_argument("--window", type=int, default=25, help="steps per window mean of the loss")
    p.add_argument("--eval-every", type=int, default=100)
    p.add_argument("--variants", default=",".join(VARIANTS))
    p.add_argument("--out", type=Path, default=Path("/tmp/loss_parity"))
    p.add_argument("--json", type=Path)
    p.add_argument("--plot", type=Path, help="the curves as a PNG (default: next to --json)")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE")
    return p.parse_args()


def run(args: argparse.Namespace, name: str) -> dict | None:
    """One training run; its step losses, validations and summary, or None (said) when it failed."""
    out = args.out / name
    argv = [sys.executable, "-m", "gr00t_train", "train"]
    sets = [f"data.dataset={args.dataset}", f"data.cameras={args.cameras}", f"steps={args.steps}",
            f"output_dir={out}", f"eval.every={args.eval_every}", *QUIET, *VARIANTS[name], *args.overrides]  # fmt: skip
    for item in sets:
        argv += ["--set", item]
    started = time.perf_counter()
    done = subprocess.run(argv, env=os.environ.copy(), capture_output=True, text=True)
    wall = time.perf_counter() - started
    if done.returncode != 0:
        print(f"{name}: failed (exit {done.returncode})\n{done.stderr[-3000:]}", file=sys.stderr)
        return None
    lines = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines() if line.strip()]
    losses = {int(r["step"]): float(r["loss"]) for r in lines if r.get("kind") is None and "loss" in r}
    vals = [
        {"step": r["step"], "mse": r["mse"], "ratio": r["ratio"]} for r in lines if r.get("kind") == "val"
    ]
    summary = json.loads((out / "summary.json").read_text())
    print(f"{name}: {len(losses)} steps in {wall:.0f} s", flush=True)
    return {"losses": [losses[s] for s in sorted(losses)], "validation": vals, "wall_s": wall,
            "samples_per_s": summary.get("samples_per_s"), "peak_gib": summary.get("peak_memory_gib")}  # fmt: skip


def windows(losses: list[float], size: int) -> list[float]:
    """Mean of each whole window of `size` steps (a single step's loss is one noisy draw of the batch)."""
    return [sum(losses[i : i + size]) / size for i in range(0, len(losses) - size + 1, size)]


def compare(result: dict, reference: dict, size: int) -> dict:
    mine, ref = windows(result["losses"], size), windows(reference["losses"], size)
    rel = [abs(a - b) / abs(b) for a, b in zip(mine, ref) if b]
    return {"max_rel_diff": max(rel, default=float("nan")), "mean_rel_diff": sum(rel) / max(len(rel), 1),
            "last_window": mine[-1] if mine else float("nan"),
            "reference_last_window": ref[-1] if ref else float("nan")}  # fmt: skip


def plot(path: Path, results: dict[str, dict], size: int) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 4.5))
    for name, result in results.items():
        means = windows(result["losses"], size)
        ax.plot([size * (i + 1) for i in range(len(means))], means, "o-", ms=3, lw=1.2, label=name)
    ax.set_xlabel("step")
    ax.set_ylabel(f"training loss (mean over {size} steps)")
    ax.set_yscale("log")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    print(f"wrote {path}")


def main() -> int:
    args = parse()
    names = [n for n in args.variants.split(",") if n]
    unknown = [n for n in names if n not in VARIANTS]
    if unknown or "reference" not in names:
        sys.exit(f"--variants: {unknown or 'reference is required'} (known: {', '.join(VARIANTS)})")
    results = {name: r for name in names if (r := run(args, name)) is not None}
    if "reference" not in results:
        return 1
    report = {"steps": args.steps, "window": args.window, "dataset": str(args.dataset),
              "overrides": args.overrides, "variants": {}}  # fmt: skip
    print(
        f"{'variant':>10} {'max rel':>8} {'mean rel':>8} {'last loss':>9} {'val ratio':>9} {'samples/s':>9}"
    )
    for name, result in results.items():
        row = {**result, **compare(result, results["reference"], args.window)}
        report["variants"][name] = row
        ratio = result["validation"][-1]["ratio"] if result["validation"] else float("nan")
        print(f"{name:>10} {row['max_rel_diff']:8.2e} {row['mean_rel_diff']:8.2e} {row['last_window']:9.4f} "
              f"{ratio:9.3g} {result['samples_per_s'] or float('nan'):9.1f}")  # fmt: skip
    write_report(args.json, report)
    picture = args.plot or (args.json.with_suffix(".png") if args.json else None)
    if picture:
        plot(picture, results, args.window)
    return 0 if len(results) == len(names) else 1


if __name__ == "__main__":
    sys.exit(main())
