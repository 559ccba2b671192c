"""What a log flush costs the host while other Python threads are busy (CUDA only): a flush reads the CUDA
events of every step in its window (`metrics.timing.StepTimes.seconds`), and the device sits idle until the
loop launches the next step (metrics.jsonl's `between_steps_s`: about 70 ms per flush of 50 steps in
n1.6-3b's job on an H200, 2026-12-06).

    python benchmarks/probes/flush_events.py [--steps 50] [--threads 0,4] [--json OUT]

Each row times reading one window of `--steps` steps' events (7 event pairs per step, all complete) with
`--threads` pure-Python threads running beside, two ways:
  synchronize  `end.synchronize()` before each `elapsed_time` (a call that lets go of the GIL)
  query_first  `end.query()` first, synchronizing only an event not yet complete (what StepTimes does)
"""

from __future__ import annotations

import argparse
import json
import statistics
import threading
import time
from pathlib import Path

import torch
from gr00t_train.metrics.timing import StepTimer

PHASES = ("data_wait", "compute", "comm", "optimizer", "optimizer_overlapped")


def window(steps: int, x: torch.Tensor) -> list:
    timer = StepTimer(torch.device("cuda"))
    times = []
    for _ in range(steps):
        timer.begin_step()
        for name in PHASES:
            with timer.phase(name):
                x.mul_(1.0)
        times.append(timer.end_step())
    torch.cuda.synchronize()
    return times


def read_synchronizing(times: list) -> None:
    for t in times:
        for _, start, end in t._events:
            end.synchronize()
            start.elapsed_time(end)


def read_querying(times: list) -> None:
    for t in times:
        t.seconds()


def spin(stop: threading.Event) -> None:
    n = 0
    while not stop.is_set():
        n += 1  # pure Python: holds the GIL whenever it runs


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--steps", type=int, default=50)
    p.add_argument("--threads", default="0,4")
    p.add_argument("--reps", type=int, default=20)
    p.add_argument("--json", type=Path)
    args = p.parse_args()
    x = torch.ones(1 << 20, device="cuda")
    rows = {}
    for count in (int(n) for n in args.threads.split(",")):
        stop = threading.Event()
        busy = [threading.Thread(target=spin, args=(stop,), daemon=True) for _ in range(count)]
        for thread in busy:
            thread.start()
        for name, read in (("synchronize", read_synchronizing), ("query_first", read_querying)):
            ms = []
            for _ in range(args.reps):
                times = window(args.steps, x)
                started = time.perf_counter()
                read(times)
                ms.append((time.perf_counter() - started) * 1e3)
            rows[f"{name}_threads_{count}"] = {"median_ms": statistics.median(ms), "max_ms": max(ms)}
            print(f"{name:12s} threads {count}: {statistics.median(ms):7.2f} ms median, {max(ms):7.2f} max "
                  f"per window of {args.steps} steps", flush=True)  # fmt: skip
        stop.set()
        for thread in busy:
            thread.join()
    if args.json:
        args.json.write_text(json.dumps({"steps": args.steps, "date": time.strftime("%Y-%m-%d"),
                                         "device": torch.cuda.get_device_name(), "rows": rows}, indent=2) + "\n")  # fmt: skip


if __name__ == "__main__":
    main()
