"""vla_graph + vla_overlap: CUDA graphs whose last microbatch launches the bucket collectives from backward and
holds the sync (GraphConfig.sync_in_graph, OverlapDataParallel.launch_in_backward) train exactly like the
eager overlap loop. Run one process per device:

    torchrun --standalone --nproc-per-node N tests/integration/_graph_overlap_check.py [cpu|cuda]

Prints one line per compared run and exits non-zero on the first difference. On CPU the graph modes run
emulated (vla_graph's eager stand-in for capture and replay), which still checks the bookkeeping.
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


def train(mode: str, comm: str, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """(final parameters, losses) after STEPS steps of MICRO microbatches in graph `mode`."""
    model = _model(device)
    graphs = mode != "eager"
    stream = vla_graph.capture_stream(device) if graphs else contextlib.nullcontext()
    with stream:  # autograd nodes of the wrapper's hooks on the capture stream (vla_graph README)
        config = vla_overlap.OverlapConfig(bucket_elements=20_000, overlap_param_gather=False)
        wrapped = vla_overlap.OverlapDataParallel(model, config)
        params = list(model.parameters())
        if comm == "zero1_overlap":
            optimizer = vla_overlap.DistributedAdamW(wrapped, params, lr=1e-3)
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
        grad_sync=wrapped.grad_sync,
    )
    losses = []
    for s in range(STEPS):
        losses += step(_batches(s, dist.get_rank(), device))
        wrapped.clip_grad_norm_(1.0)  # the sharded optimizer's clip under ZeRO-1
        optimizer.step()
    wrapped.finish_param_sync()
    if graphs and device.type == "cuda":
        assert step.report.backend == "cuda_graph" and step.report.replays == STEPS, step.report
    flat = torch.cat([p.detach().flatten() for p in model.parameters()])
    return flat, torch.stack(losses)


def main() -> None:
    kind = sys.argv[1] if len(sys.argv) > 1 else ("cuda" if torch.cuda.is_available() else "cpu")
    if kind == "cuda":
        device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", 0)))
        torch.cuda.set_device(device)
        dist.init_process_group("nccl", device_id=device)
    else:
        device = torch.device("cpu")
        dist.init_process_group("gloo")
    failed = False
    for comm in ("overlap", "zero1_overlap"):
        ref_params, ref_losses = train("eager", comm, device)
        # Known gap: ZeRO-1 with its sync captured in a full_iteration graph differs from eager at 2 GPUs (max
        # 5.9e-3 after 4 steps, H200 x2, 2026-11-29; bitwise at 1 GPU); gr00t-train keeps that sync eager.
        modes = ("per_microbatch", "full_iteration") if comm == "overlap" else ("per_microbatch",)
        for mode in modes:
            params, losses = train(mode, comm, device)
            same = torch.equal(params, ref_params) and torch.equal(losses, ref_losses)
            diff = (params - ref_params).abs().max().item()
            if dist.get_rank() == 0:
                verdict = "bitwise equal" if same else f"DIFFERENT (max {diff:.3e})"
                print(f"{comm:>14} {mode:>15} vs eager: {verdict}", flush=True)
            failed |= not same
    rank = dist.get_rank()
    dist.destroy_process_group()
    if failed:
        sys.exit(1)
    if rank == 0:  # one writer: the ranks' lines would interleave in the launcher's stdout
        print("OK", flush=True)


if __name__ == "__main__":
    main()
