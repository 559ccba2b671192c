"""Does the checkpoint pool's background pinning hold up the training loop? (CUDA only.) A loop of GEMM steps
(CUDA events per step, a host sync every 10 steps, as the trainer's log flush) runs while `HostPool` pins
`--gb` in a background thread, once with the chunks pinned back to back and once resting `--rest` times
as long as each chunk took (`host_pool.REST`); and once without pinning. Per row: the loop's wall seconds
against its steps' and gaps' device seconds (events; `lost_s`: the rest, where the device waited before the
first step's event), the longest host iteration, and how long the pinning took.

    python benchmarks/probes/pinning_beside_steps.py --gb 24 --steps 1000 [--rest 1.0] [--json OUT]
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch
from gr00t_train.checkpoint.host_pool import CHUNK_BYTES, REST, HostPool


def loop(steps: int, x: torch.Tensor, pool: HostPool | None, sizes: list[int], rest: float) -> dict:
    torch.cuda.synchronize()
    marks: list[tuple[torch.cuda.Event, torch.cuda.Event]] = []
    wall = time.perf_counter()
    if pool is not None:
        pool.reserve_in_background(sizes, rest=rest)
    host_gaps = []
    last = time.perf_counter()
    for step in range(steps):
        begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        begin.record()
        y = x
        for _ in range(12):
            y = y @ x
        end.record()
        marks.append((begin, end))
        if (step + 1) % 10 == 0:
            end.synchronize()
        now = time.perf_counter()
        host_gaps.append(now - last)
        last = now
    torch.cuda.synchronize()
    wall = time.perf_counter() - wall
    stepped = sum(b.elapsed_time(e) for b, e in marks) / 1e3
    between = sum(marks[i][1].elapsed_time(marks[i + 1][0]) for i in range(len(marks) - 1)) / 1e3
    pinned_s = None
    if pool is not None:
        pool.join()
        pinned_s = pool.reserve_s
    return {"wall_s": wall, "steps_s": stepped, "between_s": between, "lost_s": wall - stepped - between,
            "max_host_iteration_s": max(host_gaps), "pin_s": pinned_s}  # fmt: skip


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--gb", type=float, default=24.0)
    p.add_argument("--steps", type=int, default=1000)
    p.add_argument("--rest", type=float, default=REST)
    p.add_argument("--json", type=Path)
    args = p.parse_args()
    x = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16) / 90
    sizes = [CHUNK_BYTES] * round(args.gb * 1e9 / CHUNK_BYTES)
    loop(20, x, None, sizes, 0.0)  # warm-up
    result = {"gb": args.gb, "steps": args.steps, "date": time.strftime("%Y-%m-%d"), "rows": {}}
    for name, pool, rest in (
        ("no_pinning", None, 0.0),
        ("pinning_back_to_back", HostPool(pinned=True), 0.0),
        (f"pinning_rest_{args.rest}", HostPool(pinned=True), args.rest),
    ):
        row = loop(args.steps, x, pool, sizes, rest)
        if pool is not None:
            pool.close()
            torch._C._host_emptyCache()
        result["rows"][name] = row
        print(name, ", ".join(f"{k} {v:.3f}" for k, v in row.items() if v is not None), flush=True)
    if args.json:
        args.json.write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
