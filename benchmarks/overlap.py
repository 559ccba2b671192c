"""Step time of a stack of transformer layers under each data-parallel communication mode.

Modes (same model, data, optimizer settings; each rank trains on its own microbatches):
  local                     no communication at all: the compute-only reference
  allreduce_after_backward  vla_overlap buffers, every bucket all-reduced after backward (baseline)
  ddp                       torch.nn.parallel.DistributedDataParallel
  overlap                   vla_overlap, bucket all-reduces launched during backward
  zero1_overlap             overlap + DistributedAdamW (reduce-scatter, sharded AdamW, gathers in forward)
  zero1_sync_gather         the same, parameters all-gathered at the end of step() instead

Exposed communication = step time - step time of `local` (at world size 1: the wrapper's own overhead).

  (from the repo root, with PYTHONPATH=$(ls -d $PWD/packages/*/src | tr '\n' ':'))
  python benchmarks/overlap.py --nproc 2                       # CPU, gloo, spawns 2 processes
  python benchmarks/overlap.py --device cuda --nproc 1 --json benchmarks/results/overlap_h200_ws1.json
  torchrun --nproc-per-node 8 benchmarks/overlap.py --device cuda
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import gc
import json
import os
import platform
import socket
import statistics
import time
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn.functional as F
from torch import nn
from vla_overlap import DistributedAdamW, OverlapConfig, OverlapDataParallel

MODES = ("local", "allreduce_after_backward", "ddp", "overlap", "zero1_overlap", "zero1_sync_gather")
PRESETS = {
    "cpu": dict(layers=4, d_model=256, heads=8, seq=64, batch=4, micro=2, steps=8, warmup=2),
    "h200": dict(layers=12, d_model=2048, heads=16, seq=2048, batch=8, micro=2, steps=12, warmup=3),
}


class Layer(nn.Module):
    """Pre-norm transformer layer: self-attention (SDPA) + 4x GELU MLP; ~12 d^2 parameters."""

    def __init__(self, d: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.norm1, self.norm2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.qkv, self.proj = nn.Linear(d, 3 * d), nn.Linear(d, d)
        self.fc1, self.fc2 = nn.Linear(d, 4 * d), nn.Linear(4 * d, d)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s, d = x.shape
        q, k, v = self.qkv(self.norm1(x)).view(b, s, 3, self.heads, d // self.heads).permute(2, 0, 3, 1, 4)
        attn = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(attn.transpose(1, 2).reshape(b, s, d))
        return x + self.fc2(F.gelu(self.fc1(self.norm2(x))))


def build(args: argparse.Namespace, mode: str, device: torch.device):
    torch.manual_seed(0)
    with device:  # initialize on the device: a CPU init of hundreds of millions of weights takes seconds
        module = nn.Sequential(*(Layer(args.d_model, args.heads) for _ in range(args.layers)))
    fused = device.type == "cuda"
    config = OverlapConfig(bucket_elements=args.bucket_elements, overlap_param_gather=mode == "zero1_overlap")
    if mode == "local":
        return module, torch.optim.AdamW(module.parameters(), lr=1e-4, fused=fused)
    if mode == "ddp":
        ids = [device] if device.type == "cuda" else None
        model = nn.parallel.DistributedDataParallel(module, device_ids=ids, bucket_cap_mb=args.ddp_bucket_mb)
        return model, torch.optim.AdamW(module.parameters(), lr=1e-4, fused=fused)
    if mode == "allreduce_after_backward":
        config.overlap_grad_reduce = False
    model = OverlapDataParallel(module, config)
    if mode.startswith("zero1"):
        return model, DistributedAdamW(model, lr=1e-4)
    return model, torch.optim.AdamW(model.trainable_parameters(), lr=1e-4, fused=fused)


def time_mode(
    args: argparse.Namespace, mode: str, device: torch.device, inputs: list[torch.Tensor]
) -> list[float]:
    model, opt = build(args, mode, device)
    autocast = (
        torch.autocast(device.type, dtype=torch.bfloat16) if args.autocast else contextlib.nullcontext()
    )
    times = []
    for step in range(args.warmup + args.steps):
        if device.type == "cuda":
            torch.cuda.synchronize()
        dist.barrier()  # every rank starts the step together; the barrier is outside the timed region
        start = time.perf_counter()
        model.zero_grad()
        for m, x in enumerate(inputs):
            last = m == len(inputs) - 1
            sync = contextlib.nullcontext() if last or mode == "local" else model.no_sync()
            with sync:
                with autocast:
                    loss = model(x).float().pow(2).mean()
                loss.backward()
        opt.step()
        if device.type == "cuda":
            torch.cuda.synchronize()
        if step >= args.warmup:
            times.append(time.perf_counter() - start)
    del model, opt
    gc.collect()  # the wrapper's hooks form reference cycles: free its buffers before the next mode
    if device.type == "cuda":
        torch.cuda.empty_cache()
    return times


def worker(rank: int, world_size: int, args: argparse.Namespace) -> dict | None:
    torch.set_num_threads(args.threads)
    device = (
        torch.device("cuda", rank % max(torch.cuda.device_count(), 1))
        if args.device == "cuda"
        else torch.device("cpu")
    )
    if device.type == "cuda":
        torch.cuda.set_device(device)
    if not dist.is_initialized():
        dist.init_process_group("nccl" if device.type == "cuda" else "gloo", rank=rank, world_size=world_size)
    g = torch.Generator(device=device).manual_seed(rank)
    inputs = [
        torch.randn(args.batch, args.seq, args.d_model, device=device, generator=g) for _ in range(args.micro)
    ]
    samples: dict[str, list[float]] = {mode: [] for mode in args.modes}
    for _ in range(args.repeats):  # interleave the modes: drift on a shared machine hits them alike
        for mode in args.modes:
            samples[mode] += time_mode(args, mode, device, inputs)
    # Rank 0 reports the slowest rank's median (a step is as slow as its slowest rank).
    medians = torch.tensor(
        [statistics.median(samples[m]) for m in args.modes], dtype=torch.float64, device=device
    )
    dist.all_reduce(medians, op=dist.ReduceOp.MAX)
    result = None
    if rank == 0:
        result = report(args, world_size, device, dict(zip(args.modes, medians.tolist())), samples)
    dist.destroy_process_group()
    return result


def report(args, world_size, device, medians: dict[str, float], samples: dict[str, list[float]]) -> dict:
    params = args.layers * (12 * args.d_model**2 + 13 * args.d_model)  # Layer's parameter count
    hardware = (
        torch.cuda.get_device_name(device)
        if device.type == "cuda"
        else f"{platform.processor() or 'cpu'}, {os.cpu_count()} cores"
    )
    local = medians.get("local")
    rows = []
    print(
        f"\n{args.layers} layers x d={args.d_model} ({params / 1e6:.1f} M params), {args.micro} microbatches of "
        f"{args.batch}x{args.seq} tokens, world size {world_size}, {device.type} ({hardware})"
    )
    print(f"{'mode':<26}{'step ms':>10}{'exposed comm ms':>17}{'vs local':>10}")
    for mode, median in medians.items():
        exposed = None if local is None else (median - local) * 1e3
        rel = None if local is None else 100.0 * (median - local) / local
        rows.append(
            {
                "mode": mode,
                "step_ms": median * 1e3,
                "exposed_comm_ms": exposed,
                "overhead_pct": rel,
                "samples_ms": [t * 1e3 for t in samples[mode]],
            }
        )
        extra = "" if exposed is None else f"{exposed:>17.2f}{rel:>+9.1f}%"
        print(f"{mode:<26}{median * 1e3:>10.2f}{extra}")
    if world_size == 1 and local is not None:
        for mode, target in (("overlap", " (target < 2%)"), ("zero1_overlap", "")):
            if mode in medians:
                pct = 100.0 * (medians[mode] - local) / local
                print(f"{mode} overhead at world size 1: {pct:+.2f}% of step time{target}")
    return {
        "benchmark": "overlap",
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "host": socket.gethostname(),
        "hardware": hardware,
        "device": device.type,
        "world_size": world_size,
        "torch": torch.__version__,
        "config": {k: v for k, v in vars(args).items() if k not in ("json",)},
        "params": params,
        "results": rows,
        "note": args.note,
    }


def _spawned(rank: int, world_size: int, args: argparse.Namespace, port: int) -> None:
    os.environ.update(
        MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(world_size)
    )
    result = worker(rank, world_size, args)
    if result is not None and args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(result, indent=2) + "\n")
        print(f"wrote {args.json}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    parser.add_argument("--nproc", type=int, default=2, help="processes to spawn when not under torchrun")
    parser.add_argument(
        "--preset", choices=tuple(PRESETS), default=None, help="default: cpu or h200 by --device"
    )
    for name in ("layers", "d_model", "heads", "seq", "batch", "micro", "steps", "warmup"):
        parser.add_argument(f"--{name.replace('_', '-')}", type=int, default=None)
    parser.add_argument("--repeats", type=int, default=1, help="rounds over all modes (interleaved)")
    parser.add_argument(
        "--bucket-elements", type=int, default=40_000_000, help="vla_overlap bucket size (elements)"
    )
    parser.add_argument("--ddp-bucket-mb", type=float, default=25.0)
    parser.add_argument(
        "--autocast",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="bf16 autocast (default: on CUDA)",
    )
    parser.add_argument("--threads", type=int, default=1, help="torch CPU threads per process")
    parser.add_argument("--modes", nargs="+", choices=MODES, default=list(MODES))
    parser.add_argument("--note", default="", help="free text stored in the JSON (e.g. 'shared machine')")
    parser.add_argument("--json", default=None, help="write the results here")
    args = parser.parse_args(argv)
    preset = PRESETS[args.preset or ("h200" if args.device == "cuda" else "cpu")]
    for key, value in preset.items():
        if getattr(args, key) is None:
            setattr(args, key, value)
    if args.autocast is None:
        args.autocast = args.device == "cuda"
    if "RANK" in os.environ:  # under torchrun
        result = worker(int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"]), args)
        if result is not None and args.json:
            Path(args.json).parent.mkdir(parents=True, exist_ok=True)
            Path(args.json).write_text(json.dumps(result, indent=2) + "\n")
        return 0
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    mp.spawn(_spawned, args=(args.nproc, args, port), nprocs=args.nproc, join=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
