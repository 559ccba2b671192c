"""DistributedAdamW's step with fp32 vs 8-bit moments (moments="int8") over 1.62 B trainable bf16 weights (n1.6-3b's
count) on one GPU: step time and memory.

    PYTHONPATH=<the packages' src folders> python benchmarks/probes/adam8bit.py [--json OUT] [--numel N]

Two parts, each variant in turn on a fresh allocator:
- `kernel`: the flat kernels alone on one flat shard (fp32 master, bf16 gradient and weights, the moments), one
  step captured in a CUDA graph and replayed; ms and the bandwidth of the bytes the step must move.
- `optimizer`: DistributedAdamW(flat="triton") at world size 1 (NCCL) over 386 bf16 weights of 2048 x 2048, bf16
  gradient buffers: clip + step ms (median of 10 after 3), the optimizer's state bytes (masters, moments with
  scales, remainders) and the peak allocated over the steps.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the shared helpers in benchmarks/
from _cuda_timing import cuda_graph_ms  # noqa: E402

GIB = 2**30


def kernel_rows(numel: int) -> list[dict]:
    from vla_overlap._flat_adamw import BLOCK
    from vla_overlap._moments8 import allocate

    numel -= numel % BLOCK
    rows = []
    for moments in ("fp32", "int8"):
        torch.cuda.empty_cache()
        base = torch.cuda.memory_allocated()
        flat = {"master": torch.randn(numel, device="cuda").mul_(0.02)}
        flat["grad"] = torch.randn(numel, device="cuda", dtype=torch.bfloat16).mul_(1e-3)
        flat["out"] = flat["master"].bfloat16()
        before = torch.cuda.memory_allocated()
        if moments == "fp32":
            flat["exp_avg"] = torch.zeros_like(flat["master"])
            flat["exp_avg_sq"] = torch.zeros_like(flat["master"])
        else:
            allocate(flat)
        moment_bytes = torch.cuda.memory_allocated() - before
        blocks = torch.stack([torch.arange(0, numel, BLOCK, device="cuda"), torch.full((numel // BLOCK,), BLOCK,
                              device="cuda"), torch.zeros(numel // BLOCK, dtype=torch.int64, device="cuda")], 1)  # fmt: skip
        table = torch.tensor([[1 - 1e-4 * 0.05, 0.9, 0.999, 1e-8, 1e-4, 0.03, 0, 0]], device="cuda")
        coef = torch.tensor(0.5, device="cuda")
        step = functools.partial(_kernel_step, flat, blocks, table, coef)
        # bytes per element: master read and written, bf16 gradient and weights, moments read and written
        moved = 4 + 4 + 2 + 2 + (16 if moments == "fp32" else 4 + 16 / 64)
        ms = cuda_graph_ms(step, calls=1, replays=10)
        rows.append({"part": "kernel", "moments": moments, "numel": numel, "ms": round(ms, 3),
                     "GB/s": round(numel * moved / ms / 1e6), "moment_GiB": round(moment_bytes / GIB, 3),
                     "total_GiB": round((torch.cuda.memory_allocated() - base) / GIB, 3)})  # fmt: skip
        print(json.dumps(rows[-1]), flush=True)
        del flat, blocks, step
    return rows


def _kernel_step(flat: dict, blocks: torch.Tensor, table: torch.Tensor, coef: torch.Tensor) -> None:
    from vla_overlap._flat_adamw_kernel import adamw_flat
    from vla_overlap._moments8_kernel import adamw8_flat

    if "exp_avg_scale" not in flat:
        adamw_flat(flat["master"], flat["grad"], flat["exp_avg"], flat["exp_avg_sq"], flat["out"], blocks, table,
                   coef, align=64)  # fmt: skip
    else:
        adamw8_flat(flat["master"], flat["grad"], flat["exp_avg"], flat["exp_avg_sq"], flat["exp_avg_scale"],
                    flat["exp_avg_sq_scale"], flat["out"], blocks, table, coef)  # fmt: skip


def optimizer_rows(numel: int) -> list[dict]:
    import torch.distributed as dist
    from torch import nn
    from vla_overlap import DistributedAdamW, OverlapConfig, OverlapDataParallel

    if not dist.is_initialized():
        dist.init_process_group("nccl", store=dist.HashStore(), rank=0, world_size=1)
    side = 2048
    count = max(1, numel // (side * side))
    rows = []
    for moments in ("fp32", "int8"):
        torch.cuda.empty_cache()
        torch.manual_seed(0)
        module = nn.ParameterList(nn.Parameter(torch.randn(side, side, device="cuda", dtype=torch.bfloat16) * 0.02)
                                  for _ in range(count))  # fmt: skip
        model = OverlapDataParallel(module, OverlapConfig(grad_reduce_dtype=None))
        before = torch.cuda.memory_allocated()
        opt = DistributedAdamW(
            model, lr=1e-4, weight_decay=0.05, flat="triton", remainders=True, moments=moments
        )
        gen = torch.Generator(device="cuda").manual_seed(1)
        grads = [torch.randn(p.shape, device="cuda", dtype=p.dtype, generator=gen).mul_(1e-3) for p in module]
        times = []
        torch.cuda.reset_peak_memory_stats()
        for step in range(13):
            opt.zero_grad()
            torch.autograd.backward(list(module), grads)
            model.finish_grad_sync()
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            opt.clip_grad_norm_(1.0)
            opt.step()
            end.record()
            torch.cuda.synchronize()
            times.append(start.elapsed_time(end))
            if step == 0:
                state_bytes = torch.cuda.memory_allocated() - before
        ms = sorted(times[3:])[len(times[3:]) // 2]
        rows.append({"part": "optimizer", "moments": moments, "numel": count * side * side, "ms": round(ms, 3),
                     "optimizer_state_GiB": round(state_bytes / GIB, 3),
                     "peak_GiB": round(torch.cuda.max_memory_allocated() / GIB, 3)})  # fmt: skip
        print(json.dumps(rows[-1]), flush=True)
        del opt, model, module, grads
    return rows


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--json", help="write the rows here")
    p.add_argument("--numel", type=int, default=1_620_000_000, help="trainable elements (n1.6-3b: 1.62 B)")
    p.add_argument("--parts", nargs="+", default=["kernel", "optimizer"], choices=["kernel", "optimizer"])
    a = p.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("adam8bit.py needs a CUDA device")
    torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", 0)))
    rows = (kernel_rows(a.numel) if "kernel" in a.parts else []) + (
        optimizer_rows(a.numel) if "optimizer" in a.parts else []
    )
    if a.json:
        Path(a.json).write_text(json.dumps({"device": torch.cuda.get_device_name(), "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
