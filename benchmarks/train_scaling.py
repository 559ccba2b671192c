"""Data-parallel scaling of the full training stack: one `gr00t-train train` command (the libero preset: every
optimization on) run through torchrun at each world size, back to back on one machine.

Each row: world size, samples/s (all GPUs) and per GPU, scaling over the first row, step ms, exposed
communication ms (the step minus the first row's step: every GPU does the same work at every world size, so
the difference is communication the step waits for), optimizer ms (in the step, or on its side stream with
optimizations.optimizer_overlap), MFU, peak memory of rank 0 and the loss of the last steps.

    python -m vla_io synth /tmp/libero --preset libero --episodes 6
    python benchmarks/train_scaling.py --dataset /tmp/libero --nproc 1,2 \\
        --json benchmarks/results/train_scaling_h200x2_<date>.json
    python benchmarks/train_scaling.py --dataset D --nproc 1,2 --steps 2 --warmup 1 \\
        --set device=cpu --set model.preset=tiny --set data.batch_size=2   # a CPU smoke run (gloo)
"""

from __future__ import annotations

import argparse
import sys
import time

from _train_runs import add_run_arguments, train, write_report


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_run_arguments(p, "runs/train_scaling")
    p.add_argument("--nproc", default="1,2", help="comma-separated world sizes, run in this order")
    p.add_argument("--steps", type=int, default=30, help="measured steps per row")
    p.add_argument("--warmup", type=int, default=6, help="steps before measuring (compile, capture)")
    return p.parse_args(argv)


def settings(args: argparse.Namespace) -> list[str]:
    """The `--set`s of every row (the output folder comes per row)."""
    return [f"data.dataset={args.dataset}", f"data.num_workers={args.workers}", f"steps={args.warmup + args.steps}",
            f"logging.summary_skip={args.warmup}", "optim.warmup_ratio=0", *args.overrides]  # fmt: skip


def row(summary: dict, first: dict | None) -> dict:
    """One row of the table from a run's summary.json (`first`: the first row's, for scaling)."""
    step_ms = 1000 * summary["step_time_s"]
    optimizer_ms = 1000 * (summary["breakdown_s"].get("optimizer", 0.0) or summary["optimizer_overlapped_s"])
    out = {
        "world_size": summary["world_size"],
        "samples_per_s": summary["samples_per_s"],
        "samples_per_s_per_gpu": summary["samples_per_s"] / summary["world_size"],
        "step_ms": step_ms,
        "breakdown_ms": {k: 1000 * v for k, v in summary["breakdown_s"].items()},
        "optimizer_ms": optimizer_ms,
        "optimizer_on_side_stream": not summary["breakdown_s"].get("optimizer"),
        "mfu": summary["mfu"],
        "peak_tflops": summary.get("peak_tflops"),
        "peak_memory_gib": summary.get("peak_memory_gib"),
        "final_loss": summary["final_loss"],
    }
    if first is not None:
        out["scaling"] = summary["samples_per_s"] / first["samples_per_s"]
        out["exposed_comm_ms"] = step_ms - 1000 * first["step_time_s"]
    return out


def table(rows: list[dict]) -> str:
    head = (f"{'GPUs':>4}{'samples/s':>11}{'per GPU':>9}{'scaling':>9}{'step ms':>9}{'exposed comm':>14}"
            f"{'optimizer':>11}{'MFU':>7}{'mem GiB':>9}")  # fmt: skip
    lines = [head, "-" * len(head)]
    for r in rows:
        mfu = "n/a" if r["mfu"] is None else f"{100 * r['mfu']:.1f}%"
        mem = "n/a" if r["peak_memory_gib"] is None else f"{r['peak_memory_gib']:.1f}"
        side = " side" if r["optimizer_on_side_stream"] else ""
        lines.append(
            f"{r['world_size']:>4}{r['samples_per_s']:>11.1f}{r['samples_per_s_per_gpu']:>9.1f}"
            f"{r.get('scaling', 1.0):>8.2f}x{r['step_ms']:>9.1f}{r.get('exposed_comm_ms', 0.0):>14.1f}"
            f"{r['optimizer_ms']:>6.1f}{side:<5}{mfu:>7}{mem:>9}"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    sizes = [int(n) for n in args.nproc.split(",")]
    rows, first = [], None
    for nproc in sizes:
        started = time.perf_counter()
        summary = train(f"world size {nproc}", nproc, settings(args), args.out / f"ws{nproc}")
        if summary is None:
            return 1
        rows.append(row(summary, first) | {"wall_s": time.perf_counter() - started})
        first = first or summary
    print(table(rows))
    report = {"date": time.strftime("%Y-%m-%d %H:%M"), "settings": settings(args), "rows": rows}
    write_report(args.json, report)
    return 0


if __name__ == "__main__":
    sys.exit(main())
