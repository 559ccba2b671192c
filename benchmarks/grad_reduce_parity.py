"""Loss parity of bf16 gradient reduction (`optimizations.grad_reduce_dtype=bfloat16`) with the fp32 one, with
the drift between two identical fp32 runs beside it as the yardstick (on a GPU two runs of one command already
differ: atomics in some backward kernels add in a varying order).

Three runs of the same `gr00t-train train` command (libero preset) through torchrun at one world size: fp32,
fp32 again, bf16. Reported: per-step relative loss differences (largest, mean, mean over the last 50 steps) of
"fp32 vs fp32" and "bf16 vs fp32", and each run's step time, exposed communication in it (`comm` of the step
breakdown: the part of the reduction the step waits for outside the graphs; inside them it is in `compute`,
and benchmarks/train_scaling.py's step difference to world size 1 measures it) and samples/s.

    python benchmarks/grad_reduce_parity.py --dataset /tmp/libero --nproc 2 --steps 300 \\
        --json benchmarks/results/grad_reduce_parity_h200x2_<date>.json
    python benchmarks/grad_reduce_parity.py --dataset D --nproc 2 --steps 4 --set device=cpu \\
        --set model.preset=tiny --set data.batch_size=2      # a CPU smoke run (gloo)
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

from _train_runs import add_run_arguments, train, write_report
from gr00t_train.metrics.component import read_history

RUNS = (("fp32", "float32"), ("fp32-again", "float32"), ("bf16", "bfloat16"))


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_run_arguments(p, "runs/grad_reduce_parity")
    p.add_argument("--nproc", type=int, default=2, help="world size (torchrun processes)")
    p.add_argument("--steps", type=int, default=300, help="optimizer steps per run")
    return p.parse_args(argv)


def settings(args: argparse.Namespace, dtype: str) -> list[str]:
    return [f"data.dataset={args.dataset}", f"data.num_workers={args.workers}", f"steps={args.steps}",
            f"optimizations.grad_reduce_dtype={dtype}", *args.overrides]  # fmt: skip


def losses(run: Path) -> dict[int, float]:
    """{step: loss} of a run's metrics.jsonl."""
    return {record.step: record.loss for record in read_history(run / "metrics.jsonl")}


def gaps(a: dict[int, float], b: dict[int, float]) -> dict[str, float]:
    """Relative per-step loss differences of two runs over their common steps."""
    steps = sorted(set(a) & set(b))
    rel = [abs(a[s] - b[s]) / max(abs(a[s]), 1e-12) for s in steps]
    return {"steps": len(rel), "max_rel_diff": max(rel), "mean_rel_diff": statistics.fmean(rel),
            "mean_rel_diff_last_50": statistics.fmean(rel[-50:])}  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    runs = {}
    for name, dtype in RUNS:
        summary = train(name, args.nproc, settings(args, dtype), args.out / name)
        if summary is None:
            return 1
        runs[name] = {
            "grad_reduce_dtype": dtype,
            "samples_per_s": summary["samples_per_s"],
            "step_ms": 1000 * summary["step_time_s"],
            "comm_ms": 1000 * summary["breakdown_s"].get("comm", 0.0),
            "final_loss": summary["final_loss"],
            "losses": losses(args.out / name),
        }
    report = {
        "date": time.strftime("%Y-%m-%d %H:%M"),
        "world_size": args.nproc,
        "fp32_vs_fp32": gaps(runs["fp32"]["losses"], runs["fp32-again"]["losses"]),
        "bf16_vs_fp32": gaps(runs["fp32"]["losses"], runs["bf16"]["losses"]),
        "runs": runs,
    }
    for key in ("fp32_vs_fp32", "bf16_vs_fp32"):
        g = report[key]
        print(f"{key}: {g['steps']} steps, largest relative loss difference {g['max_rel_diff']:.2e}, "
              f"mean {g['mean_rel_diff']:.2e} (last 50: {g['mean_rel_diff_last_50']:.2e})")  # fmt: skip
    for name, run in runs.items():
        print(f"{name}: {run['samples_per_s']:.1f} samples/s, step {run['step_ms']:.1f} ms, "
              f"exposed comm {run['comm_ms']:.1f} ms")  # fmt: skip
    write_report(args.json, report)
    return 0


if __name__ == "__main__":
    sys.exit(main())
