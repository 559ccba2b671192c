"""Data parallelism at N processes vs one process with gradient accumulation: same parameters after K steps?

Every rank builds the same seeded model and the same global batches (N x b samples per step) and trains:
  reference   on its own, no communication: plain AdamW, N microbatches of b accumulated (loss / N each)
  overlap     vla_overlap.OverlapDataParallel on its slice of b samples, plain AdamW
  zero1       the same with vla_overlap.DistributedAdamW (reduce-scatter, sharded AdamW, all-gather)
Both data-parallel modes average gradients over ranks, so they compute the reference's mean gradient. Only
rounding differs: the order of the sums, and under bf16 autocast the bf16 roundings of a backward whose loss
the reference scaled by 1/N (exact only when N is a power of two). The script reports, per mode, the largest
element difference to the reference and the difference of the whole update relative to the reference's.

  torchrun --nproc-per-node 2 benchmarks/dp_equivalence.py --device cuda --json out.json
  python benchmarks/dp_equivalence.py --nproc 2                  # CPU, gloo, spawns the processes
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import tempfile

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn.functional as F
from torch import nn
from vla_overlap import DistributedAdamW, OverlapConfig, OverlapDataParallel

ADAMW = dict(lr=1e-3, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.1)


def make_model(width: int, depth: int, device: torch.device) -> nn.Module:
    torch.manual_seed(0)
    layers: list[nn.Module] = []
    for _ in range(depth):
        layers += [nn.Linear(width, 4 * width), nn.GELU(), nn.Linear(4 * width, width), nn.LayerNorm(width)]
    return nn.Sequential(*layers).to(device)


def global_batch(step: int, n: int, width: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(1000 + step)
    x = torch.randn(n, 64, width, generator=g)
    return x.to(device), torch.sin(x).to(device)


def loss_of(model: nn.Module, x: torch.Tensor, y: torch.Tensor, autocast: bool) -> torch.Tensor:
    with torch.autocast(x.device.type, dtype=torch.bfloat16, enabled=autocast):
        out = model(x)
    return F.mse_loss(out.float(), y)


def train(mode: str, args: argparse.Namespace, rank: int, world: int, device: torch.device) -> nn.Module:
    module = make_model(args.width, args.depth, device)
    if mode == "reference":
        model, opt = module, torch.optim.AdamW(module.parameters(), **ADAMW)
    else:
        model = OverlapDataParallel(module, OverlapConfig(bucket_elements=args.bucket_elements))
        opt = (
            DistributedAdamW(model, module.parameters(), **ADAMW)
            if mode == "zero1"
            else torch.optim.AdamW(module.parameters(), **ADAMW)
        )
    for step in range(args.steps):
        x, y = global_batch(step, world * args.batch, args.width, device)
        model.zero_grad()
        if mode == "reference":
            for part in range(world):
                sl = slice(part * args.batch, (part + 1) * args.batch)
                (loss_of(model, x[sl], y[sl], args.autocast) / world).backward()
        else:
            sl = slice(rank * args.batch, (rank + 1) * args.batch)
            loss_of(model, x[sl], y[sl], args.autocast).backward()
        opt.step()
    if isinstance(model, OverlapDataParallel):
        model.finish_param_sync()  # ZeRO-1 gathers updated parameters lazily (in the next forward)
    return module


@torch.no_grad()
def compare(trained: nn.Module, reference: nn.Module, initial: nn.Module) -> dict[str, float | str]:
    """Largest element difference, and the difference of the whole update relative to the reference's update
    (Adam divides by sqrt(v): an element whose gradient is ~eps turns a 1-ulp difference into a visible one,
    so the norm-wise figure is the meaningful one; at a power-of-two world size both are usually 0)."""
    trios = list(zip(trained.named_parameters(), reference.parameters(), initial.parameters()))
    diffs = {n: (p - q).abs() for (n, p), q, _ in trios}
    worst = max(diffs, key=lambda n: float(diffs[n].max()))
    err = sum(float(((p - q) ** 2).sum()) for (_, p), q, _ in trios) ** 0.5
    update = sum(float(((q - p0) ** 2).sum()) for _, q, p0 in trios) ** 0.5
    return {"max_abs_diff": float(diffs[worst].max()), "worst": worst, "update_rel_err": err / update}


def run(rank: int, world: int, args: argparse.Namespace) -> dict | None:
    device = torch.device(f"cuda:{rank % torch.cuda.device_count()}" if args.device == "cuda" else "cpu")
    if device.type == "cuda":
        torch.cuda.set_device(device)
        torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
    reference = train("reference", args, rank, world, device)
    initial = make_model(args.width, args.depth, device)
    out = {}
    for mode in ("overlap", "zero1"):
        out[mode] = compare(train(mode, args, rank, world, device), reference, initial)
    return out if rank == 0 else None


def _spawned(rank: int, world: int, store: str, args: argparse.Namespace, queue) -> None:  # noqa: ANN001
    # a file store: no port to probe, so nothing to race with other jobs for
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=world)
    result = run(rank, world, args)
    if result is not None:
        queue.put(result)
    dist.destroy_process_group()


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    p.add_argument("--nproc", type=int, default=2, help="processes to spawn when not under torchrun")
    p.add_argument("--width", type=int, default=256)
    p.add_argument("--depth", type=int, default=4)
    p.add_argument("--batch", type=int, default=4, help="samples per rank and step")
    p.add_argument("--steps", type=int, default=5)
    p.add_argument("--bucket-elements", type=int, default=300_000, help="vla_overlap bucket size (elements)")
    p.add_argument("--autocast", action=argparse.BooleanOptionalAction, default=True)
    p.add_argument("--json", default=None)
    args = p.parse_args()
    if "RANK" in os.environ:  # torchrun
        backend = "nccl" if args.device == "cuda" else "gloo"
        dist.init_process_group(backend)
        world, rank = dist.get_world_size(), dist.get_rank()
        result = run(rank, world, args)
        dist.destroy_process_group()
    else:
        world, rank = args.nproc, 0
        queue = mp.get_context("spawn").SimpleQueue()
        with tempfile.TemporaryDirectory(prefix="dp-equivalence-") as tmp:
            store = os.path.join(tmp, "store")
            mp.start_processes(_spawned, args=(world, store, args, queue), nprocs=world, start_method="spawn")
        result = queue.get()
    if rank != 0:
        return 0
    hardware = torch.cuda.get_device_name() if args.device == "cuda" else "cpu"
    print(
        f"world size {world}, {hardware}, autocast {args.autocast}, {args.steps} steps, batch {args.batch}/rank"
    )
    for mode, diff in result.items():
        print(f"{mode:8s} vs 1-process accumulation: max |diff| {diff['max_abs_diff']:.3e} ({diff['worst']}), "
              f"update error {diff['update_rel_err']:.2e} of the update's norm")  # fmt: skip
    if args.json:
        record = {"benchmark": "dp_equivalence", "date": datetime.datetime.now(datetime.timezone.utc).isoformat(),
                  "world_size": world, "hardware": hardware, "torch": torch.__version__, "config": vars(args),
                  "results": result}  # fmt: skip
        with open(args.json, "w") as f:
            json.dump(record, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
