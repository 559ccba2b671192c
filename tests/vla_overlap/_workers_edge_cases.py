"""Worker scenarios of test_edge_cases.py (issue 14, item 8): parameters unused in some steps, frozen
parameters in the optimizer, torch's clip under ZeRO-1, reads after step, float64 parameters."""

from __future__ import annotations

import contextlib
from typing import Any

import torch
import torch.nn.functional as F
from _workers_common import (
    ADAMW,
    D_OUT,
    ToyNet,
    batch,
    clip_grad_norm,
    make_model,
    make_scheduler,
    param_groups,
    params_of,
    run_steps,
)
from torch import nn
from torch.nn.parallel import DistributedDataParallel
from vla_overlap import DistributedAdamW, OverlapConfig, OverlapDataParallel

EDGE_STEPS = 5


def _edge_uses_branch(step: int, rank: int) -> bool:
    """The optional branch: rank 0 only at steps 0 and 1 (moments start; with gathers pending at 1), nobody
    at 2 and 4, everyone at 3."""
    return (step < 2 and rank == 0) or step == 3


def _edge_module(dtype: torch.dtype = torch.float32) -> ToyNet:
    """ToyNet with a branch used in some steps and a layer never used at all."""
    module = make_model(unused=True)
    module.dead = nn.Linear(D_OUT, D_OUT)  # registered last: the first slot of the layout
    return module.to(dtype)


def _edge_build(
    ctx: Any, mode: str, module: nn.Module, params: Any = None, find_unused: bool = False, **config: Any
):
    """DDP + torch AdamW, or one of our modes with allow_unused_params."""
    params = param_groups(module) if params is None else params
    if mode == "ddp":
        model = DistributedDataParallel(module, process_group=ctx.group, find_unused_parameters=find_unused)
        return model, torch.optim.AdamW(params, **ADAMW)
    config = OverlapConfig(
        bucket_elements=config.pop("bucket_elements", 600),
        overlap_grad_reduce=mode != "allreduce_after_backward",
        overlap_param_gather=mode != "zero1_sync_gather",
        allow_unused_params=True,
        **config,
    )
    model = OverlapDataParallel(module, config, process_group=ctx.group)
    if mode.startswith("zero1"):
        flat = "torch" if mode == "zero1_flat" else None
        return model, DistributedAdamW(model, params, **{**ADAMW, "flat": flat})
    return model, torch.optim.AdamW(params, **ADAMW)


def unused_everywhere(ctx: Any, bucket_elements: int = 600, micro: int = 2) -> dict[str, Any]:
    """Parameters no rank used in a step (and one never used) vs DDP, whose AdamW skips them (grad None).
    bucket_elements=1, micro=1: every parameter in a bucket of its own and one forward per step, so the lazy
    gathers of the buckets after the branch are dispatched before backward on the ranks that run it only."""
    out = {}
    for mode in ("ddp", "overlap", "allreduce_after_backward", "zero1", "zero1_sync_gather", "zero1_flat"):
        module = _edge_module()
        model, opt = _edge_build(ctx, mode, module, find_unused=True, bucket_elements=bucket_elements)
        grads_none = []
        for step in range(EDGE_STEPS):
            module.use_extra = _edge_uses_branch(step, ctx.rank)
            model.zero_grad()
            for m in range(micro):
                x, y = batch(step, m, ctx.rank, ctx.world_size)
                with contextlib.nullcontext() if m == micro - 1 else model.no_sync():
                    (F.mse_loss(model(x), y) / micro).backward()
            grads_none.append([module.unused.weight.grad is None, module.dead.weight.grad is None])
            opt.step()
        if isinstance(opt, DistributedAdamW):
            # through a state dict round trip: the step counts a fresh optimizer read back (flat: per piece)
            fresh_module = _edge_module()
            _, fresh_opt = _edge_build(ctx, mode, fresh_module, bucket_elements=bucket_elements)
            fresh_opt.load_state_dict(opt.state_dict())
            saved = fresh_opt.state_dict()["state"]
            steps = {name: float(entry["step"]) for name, entry in saved.items() if "step" in entry}
        else:
            names = {id(p): name for name, p in module.named_parameters()}
            steps = {names[id(p)]: float(entry["step"]) for p, entry in opt.state.items()}
        out[mode] = {"params": params_of(module), "grads_none": grads_none, "steps": steps}
    return out


def frozen_in_optimizer_params(ctx: Any) -> dict[str, Any]:
    """Parameter groups that include frozen parameters (as module.parameters() does): torch's AdamW skips
    them; DistributedAdamW must too."""
    out = {}
    for mode in ("ddp", "zero1", "zero1_flat"):
        module = make_model()
        named = list(module.named_parameters())  # frozen.weight / frozen.bias included
        groups = [
            {"params": [p for n, p in named if p.dim() >= 2]},
            {"params": [p for n, p in named if p.dim() < 2], "weight_decay": 0.0, "lr": 2e-2},
        ]
        model, opt = _edge_build(ctx, mode, module, params=groups)
        run_steps(ctx, model, opt, make_scheduler(opt), range(3), 2)
        out[mode] = {"params": params_of(module)}
        if mode != "ddp":
            out[mode]["saved"] = sorted(opt.state_dict()["state"])
    return out


def torch_clip_under_zero1(ctx: Any) -> dict[str, Any]:
    """torch.nn.utils.clip_grad_norm_ on a ZeRO-1 model (each rank holds a shard of the gradients)."""
    module = make_model()
    model, opt = _edge_build(ctx, "zero1", module)
    out: dict[str, Any] = {}
    for step in range(2):
        model.zero_grad()
        out[f"none_after_zero_grad_{step}"] = all(p.grad is None for p in module.parameters())
        x, y = batch(step, 0, ctx.rank, ctx.world_size)
        F.mse_loss(model(x), y).backward()
        try:
            norm = torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            out[f"torch_clip_{step}"] = f"no error, returned {float(norm)}"
        except RuntimeError as error:
            out[f"torch_clip_{step}"] = str(error)
        out[f"ours_{step}"] = float(clip_grad_norm(model, opt, 1.0))  # still works
        opt.step()
    try:  # a backward after the step's sync, without zero_grad()
        F.mse_loss(model(x), y).backward()
        out["late_backward"] = "no error"
    except RuntimeError as error:
        out["late_backward"] = str(error)
    return out


def reads_after_step(ctx: Any, how: str) -> dict[str, Any]:
    """Parameters read right after step() with the lazy (forward pre-hook) gathers still pending, through
    `how`; and what they hold once every gather finished."""
    module = make_model(dtype=torch.bfloat16)
    model, opt = _edge_build(ctx, "zero1", module)
    run_steps(ctx, model, opt, make_scheduler(opt), range(1), 2, dtype=torch.bfloat16)
    assert model._gather.pending, "the scenario needs gathers still pending"
    if how == "eval":
        model.eval()
        seen = {n: p.detach().clone() for n, p in module.named_parameters()}
    elif how == "wrapper_state_dict":
        seen = {n.removeprefix("module."): t.clone() for n, t in model.state_dict().items()}
    elif how == "module_state_dict":
        seen = params_of(module)
    elif how == "optimizer_state_dict":
        opt.state_dict()
        seen = {n: p.detach().clone() for n, p in module.named_parameters()}
    else:
        assert how == "finish_param_sync"
        model.finish_param_sync()
        seen = {n: p.detach().clone() for n, p in module.named_parameters()}
    model.finish_param_sync()
    fresh = {n: p.detach().clone() for n, p in module.named_parameters()}
    return {"stale": sorted(n for n in fresh if not torch.equal(seen[n], fresh[n]))}


def float64_params(ctx: Any) -> dict[str, Any]:
    """float64 parameters: DDP + torch AdamW (fp64 all along) vs DistributedAdamW with fp64 gradient buffers
    (grad_reduce_dtype=None) and with the default fp32 ones."""
    out: dict[str, Any] = {}
    for mode in ("ddp", "zero1", "zero1_fp32_grads"):
        module = make_model(dtype=torch.float64)
        grad_dtype = torch.float32 if mode == "zero1_fp32_grads" else None
        extra = {} if mode == "ddp" else {"grad_reduce_dtype": grad_dtype}
        model, opt = _edge_build(ctx, "zero1" if mode != "ddp" else "ddp", module, **extra)
        norms = run_steps(ctx, model, opt, make_scheduler(opt), range(3), 2, dtype=torch.float64, clip=1e9)
        out[mode] = {"params": params_of(module), "norms": norms}
        if mode != "ddp":
            saved = opt.state_dict()["state"]
            out[mode]["dtypes"] = sorted(
                {
                    str(entry[key].dtype)
                    for entry in saved.values()
                    for key in ("master", "exp_avg", "exp_avg_sq")
                }
                | {str(m.dtype) for m in opt.masters}
            )
    try:
        module = make_model(dtype=torch.float64)
        _edge_build(ctx, "zero1_flat", module, grad_reduce_dtype=None)
        out["flat"] = "no error"
    except ValueError as error:
        out["flat"] = str(error)
    return out


def unused_flags_without_python_gradients(ctx: Any) -> dict[str, Any]:
    """allow_unused_params when no gradient went through Python (what a replayed CUDA graph leaves): written
    into main_grad then start/finish_grad_sync, or recorded with mark_grads_synced(). Nothing was "seen", so
    everything counts as used; one rank's eager step with the branch unused in between."""
    module = _edge_module()
    model, opt = _edge_build(ctx, "overlap", module)
    params = model.trainable_parameters()
    out: dict[str, Any] = {}
    for step, how in enumerate(("main_grad", "eager", "mark_grads_synced")):
        model.zero_grad()
        module.use_extra = False
        if how == "eager":
            x, y = batch(step, 0, ctx.rank, ctx.world_size)
            F.mse_loss(model(x), y).backward()
        else:
            for p in params:
                p.main_grad.fill_(1.0)
            if how == "main_grad":
                model.start_grad_sync()
                model.finish_grad_sync()
            else:
                model.mark_grads_synced()
        out[how] = sorted(n for n, p in module.named_parameters() if p.requires_grad and p.grad is None)
        opt.step()
    return out
