"""GPU scenarios that must run in a fresh process: a failed CUDA graph capture can leave the process unusable.

Usage: python gpu_scenarios.py CASE. Exit status 3 means GraphCaptureError was raised (its message is
printed after "GraphCaptureError:"); 0 means the case ran and printed OK. test_gpu.py drives these."""

from __future__ import annotations

import contextlib
import os
import socket
import sys

import torch
import torch.distributed as dist
from torch import nn
from vla_graph import GraphCaptureError, GraphConfig, GraphedStep


def _model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(16, 32), nn.GELU(), nn.Linear(32, 16)).cuda()


def _batches(count: int = 2, seed: int = 0) -> list[dict]:
    gen = torch.Generator(device="cuda").manual_seed(seed)
    return [{"x": torch.randn(8, 16, device="cuda", generator=gen)} for _ in range(count)]


def _run(step_fn, model: nn.Module, **config) -> None:
    config.setdefault("mode", "per_microbatch")
    step = GraphedStep(step_fn, params=model.parameters(), config=GraphConfig(**config))
    for seed in range(2):
        step(_batches(seed=seed))
    torch.cuda.synchronize()


def unjoined(check: bool = True) -> None:
    model = _model()

    def step(batch: dict) -> torch.Tensor:
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            torch.ones(64, device="cuda").mul_(2)  # forked onto a side stream and never joined back
        loss = model(batch["x"]).square().mean()
        loss.backward()
        return loss

    _run(step, model, check=check)


def host_sync(check: bool) -> None:
    model = _model()

    def step(batch: dict) -> torch.Tensor:
        loss = model(batch["x"]).square().mean()
        if loss.item() > 1e9:  # HOST-SYNC-LINE
            raise AssertionError("unreachable")
        loss.backward()
        return loss

    _run(step, model, check=check)


def generator(check: bool) -> None:
    model = _model()
    mine = torch.Generator(device="cuda").manual_seed(1)

    def step(batch: dict) -> torch.Tensor:
        noise = torch.randn(batch["x"].shape, device="cuda", generator=mine)
        loss = model(batch["x"] + noise).square().mean()
        loss.backward()
        return loss

    _run(step, model, check=check)


def nccl_grad_sync(mode: str) -> None:
    """Gradient sync through caller callbacks with NCCL at world size 1: captured in full_iteration,
    eager after the last replay in per_microbatch; gradients equal the eager run bitwise."""

    with socket.socket() as probe:  # a free port for this process's store
        probe.bind(("127.0.0.1", 0))
        os.environ["MASTER_ADDR"], os.environ["MASTER_PORT"] = "127.0.0.1", str(probe.getsockname()[1])
    dist.init_process_group("nccl", rank=0, world_size=1, device_id=torch.device("cuda", 0))
    results = {}
    for run_mode in ("eager", mode):
        model = _model()
        params = list(model.parameters())
        step = GraphedStep(
            lambda b, model=model: _loss_backward(model, b),
            params=params,
            config=GraphConfig(mode=run_mode, sync_in_graph=False),
            grad_sync=_AllReduceSync(params),
        )
        grads = []
        for seed in range(3):
            step(_batches(seed=seed))
            grads.append([p.grad.clone() for p in params])
        results[run_mode] = grads
    same = all(torch.equal(a, b) for ga, gb in zip(results["eager"], results[mode]) for a, b in zip(ga, gb))
    dist.destroy_process_group()
    if not same:
        raise AssertionError(f"{mode} gradients after NCCL sync differ from eager")


class _AllReduceSync:
    """The smallest GradSync: all-reduce every .grad after the last backward (grads allocated up front)."""

    def __init__(self, params: list[torch.Tensor]) -> None:
        self.params, self.pending = params, []
        for p in params:
            p.grad = torch.zeros_like(p)

    def zero(self) -> None:
        torch._foreach_zero_([p.grad for p in self.params])

    def no_sync(self):
        return contextlib.nullcontext()

    launch_in_backward = no_sync

    def start(self) -> None:
        self.pending.extend(dist.all_reduce(p.grad, async_op=True) for p in self.params)

    def finish(self) -> None:
        while self.pending:
            self.pending.pop().wait()

    def mark_synced(self) -> None:
        pass


def _loss_backward(model: nn.Module, batch: dict) -> torch.Tensor:
    loss = model(batch["x"]).square().mean()
    (loss / 2).backward()
    return loss


CASES = {
    "unjoined": lambda: unjoined(),
    "host_sync_checked": lambda: host_sync(check=True),
    "host_sync_unchecked": lambda: host_sync(check=False),
    "generator_checked": lambda: generator(check=True),
    "generator_unchecked": lambda: generator(check=False),
    "nccl_full_iteration": lambda: nccl_grad_sync("full_iteration"),
    "nccl_per_microbatch": lambda: nccl_grad_sync("per_microbatch"),
}

if __name__ == "__main__":
    try:
        CASES[sys.argv[1]]()
    except GraphCaptureError as error:
        print(f"GraphCaptureError: {error}")
        sys.exit(3)
    print("OK")
