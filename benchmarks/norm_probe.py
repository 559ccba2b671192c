"""The clipping norm's sum-of-squares kernel alone, by blocks per program: over bf16 buffers the size of
n1.6-3b's gradient buckets (1.62 B elements in all), 5 calls of every bucket in one CUDA graph.

    PYTHONPATH=<the packages' src folders> python benchmarks/norm_probe.py [--json OUT]
"""

from __future__ import annotations

import argparse
import json

import torch
from _cuda_timing import cuda_graph_ms
from vla_overlap._flat_adamw_kernel import sum_of_squares


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--elements", type=int, default=1_620_000_000)
    p.add_argument("--buckets", type=int, default=58)
    p.add_argument("--json")
    args = p.parse_args()
    size = args.elements // args.buckets
    grads = [torch.randn(size, device="cuda").to(torch.bfloat16) for _ in range(args.buckets)]
    exact = sum(g.double().square().sum() for g in grads).item()
    rows = []
    for loops in (1, 2, 4, 8, 16, 32):
        got = sum(sum_of_squares(g, loops=loops) for g in grads).item()
        ms = cuda_graph_ms(lambda loops=loops: [sum_of_squares(g, loops=loops) for g in grads], calls=5)
        rows.append({"loops": loops, "ms": round(ms, 3), "tb_per_s": round(2 * size * args.buckets / ms / 1e9, 2),
                     "rel_error": abs(got - exact) / exact})  # fmt: skip
        print(rows[-1], flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"device": torch.cuda.get_device_name(), "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
