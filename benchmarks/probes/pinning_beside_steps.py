"""Does the checkpoint pool's background pinning hold up the training loop? (CUDA only.) A loop of GEMM steps
(CUDA events per step, a host sync every `--sync-every` steps, as the trainer's log flush) runs while `--gb`
of 135 MB slots (n1.6-3b's optimizer state) are pinned in a background thread:
    torch_alloc_rest    1 GiB chunks from torch's pinned allocator (cudaHostAlloc), resting as long as each
                        took (the pool before `checkpoint.pinned`)
    registered_rest_R   `HostPool` as it is: pages faulted in, then registered (`pinned.PinnedBytes`),
                        resting R times as long as each registration held the driver (R = 0 and `--rest`)
and once without pinning. Per row: the loop's wall seconds against its steps' and gaps' device seconds (events;
`lost_s`: the rest, where the device waited before the first step's event), the longest host iteration, how
long the pinning took, and the longest and total seconds its driver calls took.

    python benchmarks/probes/pinning_beside_steps.py --gb 24 --steps 1000 [--rest 1.0] [--json OUT]
"""

from __future__ import annotations

import argparse
import json
import threading
import time
from pathlib import Path

import torch
from gr00t_train.checkpoint.host_pool import REST, HostPool

SLOT = 135_000_000


class TorchPinned:
    """The old pool's reservation: 1 GiB chunks of torch's pinned allocator, resting after each."""

    def __init__(self) -> None:
        self.chunks: list[torch.Tensor] = []
        self.held_s: list[float] = []
        self.reserve_s: float | None = None
        self._thread: threading.Thread | None = None

    def reserve_in_background(self, sizes: list[int], rest: float) -> None:
        def run() -> None:
            started = time.perf_counter()
            for _ in range(-(-sum(sizes) // (1 << 30))):
                began = time.perf_counter()
                self.chunks.append(torch.empty(1 << 30, dtype=torch.uint8, pin_memory=True))
                self.held_s.append(time.perf_counter() - began)
                time.sleep(rest * self.held_s[-1])
            self.reserve_s = time.perf_counter() - started

        self._thread = threading.Thread(target=run, daemon=True)
        self._thread.start()

    def join(self) -> None:
        if self._thread is not None:
            self._thread.join()

    def close(self) -> None:
        self.join()
        self.chunks = []
        torch._C._host_emptyCache()


def loop(steps: int, x: torch.Tensor, pool, sizes: list[int], rest: float, sync_every: int) -> dict:
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
        if (step + 1) % sync_every == 0:
            end.synchronize()
        now = time.perf_counter()
        host_gaps.append(now - last)
        last = now
    torch.cuda.synchronize()
    wall = time.perf_counter() - wall
    stepped = sum(b.elapsed_time(e) for b, e in marks) / 1e3
    between = sum(marks[i][1].elapsed_time(marks[i + 1][0]) for i in range(len(marks) - 1)) / 1e3
    row = {"wall_s": wall, "steps_s": stepped, "between_s": between, "lost_s": wall - stepped - between,
           "max_host_iteration_s": max(host_gaps)}  # fmt: skip
    if pool is not None:
        pool.join()
        row.update(pin_s=pool.reserve_s, chunks=len(pool.held_s), driver_s=sum(pool.held_s),
                   max_driver_call_s=max(pool.held_s, default=0.0))  # fmt: skip
    return row


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--gb", type=float, default=24.0)
    p.add_argument("--steps", type=int, default=1000)
    p.add_argument("--rest", type=float, default=REST)
    p.add_argument("--sync-every", type=int, default=50, help="steps between host syncs (logging.every)")
    p.add_argument("--json", type=Path)
    args = p.parse_args()
    x = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16) / 90
    sizes = [SLOT] * round(args.gb * 1e9 / SLOT)
    loop(20, x, None, sizes, 0.0, args.sync_every)  # warm-up
    result = {"gb": args.gb, "steps": args.steps, "sync_every": args.sync_every,
              "date": time.strftime("%Y-%m-%d"), "rows": {}}  # fmt: skip
    for name, make, rest in (
        ("no_pinning", None, 0.0),
        ("torch_alloc_rest", TorchPinned, 1.0),
        ("registered_rest_0", lambda: HostPool(pinned=True), 0.0),
        (f"registered_rest_{args.rest:g}", lambda: HostPool(pinned=True), args.rest),
    ):
        pool = make() if make else None
        row = loop(args.steps, x, pool, sizes, rest, args.sync_every)
        if pool is not None:
            pool.close()
        result["rows"][name] = row
        print(name, ", ".join(f"{k} {v:.3f}" for k, v in row.items() if v is not None), flush=True)
    if args.json:
        args.json.write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
