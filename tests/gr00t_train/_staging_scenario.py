"""The scenario of the staging tests (CPU and CUDA): ZeRO-1 at one rank trains, a save stages its optimizer
state into the host pool, training goes on (its updates change every master and moment) and only then does
the test wait for the copies and compare them with the state at the save step."""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from gr00t_train.checkpoint.staging import Staging
from torch import nn
from vla_overlap import DistributedAdamW, OverlapConfig, OverlapDataParallel, UpdateStream


def _tensors(state: dict[str, Any]) -> dict[tuple[str, str], torch.Tensor]:
    return {(name, key): value for name, entry in state["state"].items() for key, value in entry.items()}


def stage_while_training(
    device: torch.device, width: int, saves: int = 2, side_stream: bool = False, device_copies: bool = False
) -> dict:
    """Per save: whether every staged tensor equals the state at the save step bit for bit, whether training
    changed every original before the copies were waited for, the staged tensors' addresses, and (CUDA)
    whether the next update had to wait for the copies."""
    torch.manual_seed(0)
    module = nn.Sequential(nn.Linear(width, 4 * width), nn.GELU(), nn.Linear(4 * width, width)).to(device)
    model = OverlapDataParallel(module, OverlapConfig(bucket_elements=width * width))
    opt = DistributedAdamW(model, lr=1e-2, weight_decay=0.1, flat="auto")
    staging = Staging(device, device_copies=device_copies)
    opt.register_step_pre_hook(staging.before_update)  # what CheckpointComponent registers
    updates = UpdateStream(device) if side_stream else None
    generator = torch.Generator(device).manual_seed(1)

    def step() -> None:
        if updates is not None:
            updates.wait()  # the previous update (it reads the gradients zeroed here)
        opt.zero_grad()
        x = torch.randn(64, width, device=device, generator=generator)
        F.mse_loss(model(x), x.flip(-1)).backward()
        if updates is None:
            opt.clip_grad_norm_(1.0)
            opt.step()
            return
        with updates.side():
            opt.clip_grad_norm_(1.0)
            opt.step()

    for _ in range(2):
        step()
    results = []
    for _ in range(saves):
        if updates is not None:
            updates.wait()  # as Trainer.save does
        reference = _tensors(opt.state_dict())  # CPU copies, taken synchronously at the save step
        staging.begin()
        staged = {k: staging.copy(v, guarded=k == "state") for k, v in opt.state_dict(on_device=True).items()}
        ready = staging.finish()
        guarded = staging._pending is not None  # the next update waits for the host copies
        for _ in range(3):  # training goes on before anyone waits for the copies
            step()
        ready()
        if updates is not None:
            updates.wait()  # the last update, before reading what it changed
        after = _tensors(opt.state_dict())
        copies = _tensors(staged)
        tensors = [k for k in reference if k[1] != "step"]
        results.append(
            {
                "equal": all(torch.equal(copies[k], reference[k]) for k in reference),
                "changed": all(not torch.equal(after[k], reference[k]) for k in tensors),
                "addresses": {k: copies[k].data_ptr() for k in tensors},
                "grown": staging.pool.grown,
                "capacity": staging.pool.capacity,
                "pinned": all(copies[k].is_pinned() for k in tensors) if device.type == "cuda" else None,
                "groups": staged["param_groups"] == opt.state_dict()["param_groups"],
                "snapshot_bytes": staging.snapshot_bytes,
                "update_waited": guarded,
            }
        )
    staging.close()
    return {"saves": results, "entries": len(reference), "update_wait_s": staging.update_wait_s}
