"""What writing one logging window costs the training loop's thread (`metrics.records.MetricsLogger.log`):
metrics.jsonl, the progress bar and, when `tensorboard` is installed, its scalars. After the loop reads a
window it writes these while the device runs the one step queued behind it: a write longer than that step
leaves the device idle (25.5 ms per flush of 50 steps in n1.6-3b's job on an H100, 2026-12-07, when the
window's TensorBoard scalars took 49 ms).

    python benchmarks/probes/log_window.py [--steps 50] [--windows 40] [--json OUT]

Rows: without TensorBoard, and with it (skipped when it is not installed).
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path

from gr00t_train.metrics.records import MetricsLogger, StepRecord


def records(count: int) -> list[StepRecord]:
    return [
        StepRecord(
            step=i, loss=1.0 + 1e-3 * i, lr=1e-4, grad_norm=0.5, step_time_s=0.06, samples_per_s=260.0,
            tokens_per_s=1e5, mfu=0.39, data_wait_s=0.0, h2d_s=0.001, compute_s=0.05, comm_s=0.0,
            optimizer_s=0.0, optimizer_overlapped_s=0.012, between_steps_s=0.0,
        )
        for i in range(1, count + 1)
    ]  # fmt: skip


def time_windows(tensorboard: bool, steps: int, windows: int) -> dict | None:
    rows = records(steps * windows)
    with tempfile.TemporaryDirectory() as folder:
        logger = MetricsLogger(
            folder, total_steps=len(rows), start_step=0, enabled=True, progress=True, tensorboard=tensorboard
        )
        if tensorboard and logger._tb is None:
            return None
        seconds = []
        for start in range(0, len(rows), steps):
            began = time.perf_counter()
            logger.log(rows[start : start + steps])
            seconds.append(time.perf_counter() - began)
        logger.close()
    return {"tensorboard": tensorboard, "median_ms": 1000 * statistics.median(seconds),
            "max_ms": 1000 * max(seconds)}  # fmt: skip


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--steps", type=int, default=50, help="steps per window (logging.every)")
    p.add_argument("--windows", type=int, default=40)
    p.add_argument("--json", type=Path)
    args = p.parse_args()
    rows = [row for tb in (False, True) if (row := time_windows(tb, args.steps, args.windows)) is not None]
    for row in rows:
        print(f"tensorboard={row['tensorboard']}: {row['median_ms']:.1f} ms per window of {args.steps} steps "
              f"(median of {args.windows}; max {row['max_ms']:.1f})")  # fmt: skip
    if len(rows) == 1:
        print("tensorboard is not installed: its row is skipped")
    if args.json:
        args.json.write_text(
            json.dumps({"steps": args.steps, "windows": args.windows, "rows": rows}, indent=2)
        )


if __name__ == "__main__":
    main()
