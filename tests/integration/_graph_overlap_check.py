"""vla_graph + vla_overlap: CUDA graphs that hold the gradient sync (GraphConfig.sync_in_graph) train exactly
like the eager overlap loop, for plain overlap and ZeRO-1, in both graph modes, whether the last microbatch's
backward launches the bucket collectives (launch_in_backward) or start() launches them all after it. Run one
process per device:

    torchrun --standalone --nproc-per-node N tests/integration/_graph_overlap_check.py [cpu|cuda]

Prints one line per compared run (with where the first step's reduced gradients differ, if they do) and exits
non-zero if any differs. On CPU the graph modes run emulated (vla_graph's eager stand-in for capture and
replay), which still checks the bookkeeping. benchmarks/zero1_graph_probe.py repeats its ZeRO-1 runs to count
how often they differ (issue 16) and switches the knobs below.
"""

from __future__ import annotations

import contextlib
import os
import sys

os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")  # bitwise-reproducible cuBLAS across streams

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
import torch.nn.functional as F  # noqa: E402
import vla_graph  # noqa: E402
import vla_overlap  # noqa: E402
from torch import nn  # noqa: E402

MICRO = 2
STEPS = 4
LAUNCHES = ("backward", "start")
"""Who launches the captured collectives: the last backward's hooks, or start() after that backward."""
SYNC_AFTER_STEP = False
"""Probe knob: wait for the device after every iteration."""
OPTIMIZER_ON_CAPTURE_STREAM = True
"""Probe knob: False builds DistributedAdamW (its parameter buffers) on the default stream."""
EXPOSE_BUFFERS_AS_GRADS = False
"""Probe knob: under ZeRO-1, set each .grad to its gradient buffer view instead of the raising placeholder."""


def _model(device: torch.device) -> nn.Module:
    torch.manual_seed(0)
    layers = [nn.Linear(64, 256), nn.GELU(), nn.Linear(256, 256), nn.GELU(), nn.Linear(256, 8)]
    return nn.Sequential(*layers).to(device)


def _batches(step: int, rank: int, device: torch.device) -> list[dict]:
    gen = torch.Generator().manual_seed(1000 * step + rank)
    return [
        {"x": torch.randn(8, 64, generator=gen).to(device), "y": torch.randn(8, 8, generator=gen).to(device)}
        for _ in range(MICRO)
    ]


class _StartAfterBackward:
    """A GradSync whose last backward only accumulates, so that start() launches every collective."""

    def __init__(self, sync: object) -> None:
        self._sync = sync

    def __getattr__(self, name: str) -> object:
        return getattr(self._sync, name)

    def launch_in_backward(self) -> contextlib.AbstractContextManager:
        return self._sync.no_sync()


def _reduced_grads(wrapped: vla_overlap.OverlapDataParallel, sharded: bool) -> torch.Tensor:
    """This rank's reduced gradients: its shard of every bucket (ZeRO-1) or every bucket."""
    grads = wrapped._grads
    views = [
        grads.shard_view(b) if sharded else grads.bucket_view(b) for b in range(len(wrapped.layout.buckets))
    ]
    return torch.cat([v.detach().float().clone() for v in views])


def train(
    mode: str, comm: str, device: torch.device, launch: str = "backward"
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(final parameters, losses, first step's reduced gradients) after STEPS steps of MICRO microbatches in
    graph `mode`."""
    model = _model(device)
    graphs = mode != "eager"
    stream = vla_graph.capture_stream(device) if graphs else contextlib.nullcontext()
    with stream:  # autograd nodes of the wrapper's hooks on the capture stream (vla_graph README)
        config = vla_overlap.OverlapConfig(bucket_elements=20_000, overlap_param_gather=False)
        wrapped = vla_overlap.OverlapDataParallel(model, config)
        params = list(model.parameters())
    with stream if OPTIMIZER_ON_CAPTURE_STREAM else contextlib.nullcontext():
        if comm == "zero1_overlap":
            optimizer = vla_overlap.DistributedAdamW(wrapped, params, lr=1e-3)
            if EXPOSE_BUFFERS_AS_GRADS:
                wrapped._placeholders = list(wrapped._grads.main_grads)
        else:
            optimizer = torch.optim.AdamW(params, lr=1e-3)

    def microbatch(batch: dict) -> torch.Tensor:
        # GraphedStep runs it under grad_sync.no_sync() / launch_in_backward() as the microbatch requires
        loss = F.mse_loss(wrapped(batch["x"]), batch["y"])
        (loss / MICRO).backward()
        return loss.detach()

    step = vla_graph.GraphedStep(
        microbatch,
        params=list(model.named_parameters()),
        config=vla_graph.GraphConfig(mode=mode, sync_in_graph=True),
        grad_sync=wrapped.grad_sync if launch == "backward" else _StartAfterBackward(wrapped.grad_sync),
    )
    losses = []
    for s in range(STEPS):
        losses += step(_batches(s, dist.get_rank(), device))
        if SYNC_AFTER_STEP and device.type == "cuda":
            torch.cuda.synchronize(device)
        if s == 0:
            first_grads = _reduced_grads(wrapped, comm == "zero1_overlap")
        wrapped.clip_grad_norm_(1.0)  # the sharded optimizer's clip under ZeRO-1
        optimizer.step()
    wrapped.finish_param_sync()
    if graphs and device.type == "cuda":
        assert step.report.backend == "cuda_graph" and step.report.replays == STEPS, step.report
    flat = torch.cat([p.detach().flatten() for p in model.parameters()])
    return flat, torch.stack(losses), first_grads


def _where(grads: torch.Tensor, ref: torch.Tensor) -> str:
    """Where the first step's reduced gradients differ, for diagnosis."""
    bad = (grads != ref).nonzero().flatten()
    if bad.numel() == 0:
        return "first-step gradients equal"
    g, r = grads[bad], ref[bad]
    zero = (g == 0).float().mean().item()
    ratio = (g / r.where(r != 0, torch.ones_like(r))).median().item()
    return (f"first-step gradients differ at {bad.numel()} of {grads.numel()} elements "
            f"[{bad.min().item()}..{bad.max().item()}], {zero:.0%} zero, median ratio {ratio:.3g}")  # fmt: skip


def init(kind: str) -> torch.device:
    """This process's device under torchrun ("cuda": its LOCAL_RANK GPU, NCCL; "cpu": gloo)."""
    if kind == "cuda":
        device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", 0)))
        torch.cuda.set_device(device)
        dist.init_process_group("nccl", device_id=device)
        return device
    dist.init_process_group("gloo")
    return torch.device("cpu")


def main() -> None:
    kind = sys.argv[1] if len(sys.argv) > 1 else ("cuda" if torch.cuda.is_available() else "cpu")
    device = init(kind)
    failed = False
    for comm in ("overlap", "zero1_overlap"):
        ref_params, ref_losses, ref_grads = train("eager", comm, device)
        for mode in ("per_microbatch", "full_iteration"):
            for launch in LAUNCHES:
                params, losses, grads = train(mode, comm, device, launch)
                same = torch.equal(params, ref_params) and torch.equal(losses, ref_losses)
                diff = (params - ref_params).abs().max().item()
                verdict = (
                    "bitwise equal" if same else f"DIFFERENT (max {diff:.3e}; {_where(grads, ref_grads)})"
                )
                # every rank reports a difference (the shards differ); rank 0 alone an agreement
                if dist.get_rank() == 0 or not same:
                    print(f"rank {dist.get_rank()} {comm:>14} {mode:>15} launched by {launch:>8} vs eager: {verdict}",
                          flush=True)  # fmt: skip
                failed |= not same
    rank = dist.get_rank()
    dist.destroy_process_group()
    if failed:
        sys.exit(1)
    if rank == 0:  # one writer: the ranks' lines would interleave in the launcher's stdout
        print("OK", flush=True)


if __name__ == "__main__":
    main()
