"""Worker scenarios of test_equivalence.py: every mode against torch DDP + AdamW, bf16 masters, clipping,
explicit gradient paths."""

from __future__ import annotations

import contextlib
from typing import Any

import torch
import torch.nn.functional as F
from _workers_common import (
    ADAMW,
    COMM_MODES,
    batch,
    bf16_model,
    build,
    build_comm_mode,
    clip_grad_norm,
    make_model,
    make_scheduler,
    params_of,
    patched,
    run_steps,
)
from torch import nn
from vla_overlap import DistributedAdamW, OverlapConfig, OverlapDataParallel

MODES = ("ddp", "overlap", "allreduce_after_backward", "zero1", "zero1_sync_gather", "zero1_nooverlap")


def compare_modes(
    ctx: Any, steps: int = 3, micro: int = 2, autocast: bool = False, clip: float | None = None
):
    """Final parameters (and clip norms) of every mode after the same training."""
    out = {}
    for mode in MODES:
        model, opt, sched, module = build(ctx, mode)
        norms = run_steps(ctx, model, opt, sched, range(steps), micro, autocast=autocast, clip=clip)
        out[mode] = {"params": params_of(module), "norms": norms}
    return out


def bf16_master_weights(ctx: Any, steps: int = 3, micro: int = 2, mixed: bool = False) -> dict[str, Any]:
    """bf16 parameters (or bf16 + fp32 with `mixed`, under bf16 autocast): DistributedAdamW vs a
    hand-written fp32-master reference (fp32 gradient accumulation, mean over ranks, AdamW on fp32
    masters, cast back to the parameter dtype)."""
    out = {}
    for gather_overlap in (True, False):
        module = bf16_model(mixed)
        config = OverlapConfig(bucket_elements=600, overlap_param_gather=gather_overlap)
        model = OverlapDataParallel(module, config, process_group=ctx.group)
        assert len(model.layout.buffers) == (2 if mixed else 1)
        opt = DistributedAdamW(model, **ADAMW)
        run_steps(
            ctx, model, opt, make_scheduler(opt), range(steps), micro, autocast=mixed, dtype=torch.bfloat16
        )
        out[f"zero1_gather_overlap={gather_overlap}"] = params_of(module)

    module = bf16_model(mixed)
    trainable = [p for p in module.parameters() if p.requires_grad]
    masters = [p.detach().float().clone() for p in trainable]
    opt = torch.optim.AdamW(masters, **ADAMW)
    sched = make_scheduler(opt)
    for step in range(steps):
        acc = [torch.zeros_like(m) for m in masters]
        for m in range(micro):
            x, y = batch(step, m, ctx.rank, ctx.world_size, torch.bfloat16)
            with torch.autocast("cpu", dtype=torch.bfloat16) if mixed else contextlib.nullcontext():
                out_ = module(x)
            (F.mse_loss(out_.float(), y.float()) / micro).backward()
            for a, p in zip(acc, trainable):
                a.add_(p.grad)
                p.grad = None
        for a, master in zip(acc, masters):
            a.mul_(1.0 / ctx.world_size)
            torch.distributed.all_reduce(a, group=ctx.group)
            master.grad = a
        opt.step()
        sched.step()
        with torch.no_grad():
            for p, master in zip(trainable, masters):
                p.copy_(master)
    out["reference"] = params_of(module)
    return out


# ------------------------------------------------------------------------------------------- explicit path
def explicit_path(ctx: Any, sharded: bool) -> dict[str, Any]:
    """Gradients that reach the buffers without hooks (written into main_grad, or set as .grad) and are
    reduced by start/finish_grad_sync, vs the hook path."""
    out = {}
    for how in ("hooks", "main_grad", "dot_grad"):
        mode = "zero1" if sharded else "overlap"
        # Code that adds into main_grad itself needs buffers zeroed at each step's start.
        model, opt, sched, module = build(ctx, mode, overwrite=how != "main_grad")
        params = model.trainable_parameters()
        for step in range(3):
            model.zero_grad()
            total = None
            for m in range(2):
                x, y = batch(step, m, ctx.rank, ctx.world_size)
                loss = F.mse_loss(model(x), y) / 2
                if how == "hooks":
                    with contextlib.nullcontext() if m == 1 else model.no_sync():
                        loss.backward()
                    continue
                grads = torch.autograd.grad(loss, params)  # no AccumulateGrad: hooks do not fire
                if how == "main_grad":
                    for p, g in zip(params, grads):
                        p.main_grad.add_(g)
                else:
                    total = list(grads) if total is None else [t + g for t, g in zip(total, grads)]
            if how == "dot_grad":
                for p, g in zip(params, total):
                    p.grad = g
            if how != "hooks":
                model.start_grad_sync()
                model.finish_grad_sync()
            opt.step()
            sched.step()
        out[how] = params_of(module)
    return out


def launched_in_backward(ctx: Any, sharded: bool) -> dict[str, Any]:
    """The last microbatch under launch_in_backward() with an explicit finish, and gradients reduced outside
    the wrapper then recorded with mark_grads_synced() (what a replayed CUDA graph leaves behind), vs hooks."""
    import torch.distributed as dist

    out: dict[str, Any] = {"states": []}
    for how in ("hooks", "launch_then_finish", "reduced_elsewhere"):
        model, opt, sched, module = build(ctx, "zero1" if sharded else "overlap")
        for step in range(3):
            model.zero_grad()
            for m in range(2):
                x, y = batch(step, m, ctx.rank, ctx.world_size)
                loss = F.mse_loss(model(x), y) / 2
                if m == 0 or how == "reduced_elsewhere":
                    context = model.no_sync()
                else:
                    context = contextlib.nullcontext() if how == "hooks" else model.launch_in_backward()
                with context:
                    loss.backward()
            if how == "launch_then_finish":  # every bucket launched from backward, nothing waited yet
                out["states"].append((model._grads.all_launched, model._phase.value != "finished"))
                model.finish_grad_sync()
            elif how == "reduced_elsewhere":
                grads = model._grads  # the buckets' collectives, issued by someone else
                for bucket in range(len(model.layout.buckets)):
                    view = grads.bucket_view(bucket).mul_(1.0 / ctx.world_size)
                    if sharded:  # into the shard buffer the optimizer reads
                        dist.reduce_scatter_tensor(
                            grads.shard_view(bucket), view.clone(), group=model.process_group
                        )
                    else:
                        dist.all_reduce(view, group=model.process_group)

                def refuse(*_: Any) -> None:
                    raise AssertionError("mark_grads_synced communicated")

                with (
                    patched(model._comm, "all_reduce", refuse),
                    patched(model._comm, "reduce_scatter", refuse),
                ):
                    model.mark_grads_synced()
                    norm = clip_grad_norm(model, opt, 1e9)  # sees the step as synchronized
                out["states"].append(("norm", float(norm) > 0))
            opt.step()
            sched.step()
        out[how] = params_of(module)
    return out


def reentrant_checkpoint(ctx: Any) -> dict[str, Any]:
    """Blocks under reentrant activation checkpointing (nested backward passes) vs DDP without it."""
    out = {}
    for mode in ("ddp", "overlap", "zero1"):
        model, opt, sched, module = build(ctx, mode, checkpointed=mode != "ddp")
        run_steps(ctx, model, opt, sched, range(2), 2)
        out[mode] = params_of(module)
    return out


def compare_build_modes(ctx: Any) -> dict[str, Any]:
    """Every COMM_MODES entry built by name, with clipping through the uniform helper."""
    out = {}
    for mode in COMM_MODES:
        module = make_model()
        config = OverlapConfig(bucket_elements=600)
        adamw = {k: v for k, v in ADAMW.items()}
        model, opt = build_comm_mode(module, mode, config=config, process_group=ctx.group, **adamw)
        norms = run_steps(ctx, model, opt, make_scheduler(opt), range(3), 2, clip=0.05)
        out[mode] = {"params": params_of(module), "norms": norms}
    return out


class Scalars(nn.Module):
    """Seven one-element parameters whose gradients are exactly the given constants."""

    def __init__(self, grads: list[float]) -> None:
        super().__init__()
        self.weights = nn.ParameterList(nn.Parameter(torch.zeros(1)) for _ in grads)
        self.register_buffer("grads", torch.tensor(grads))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return sum(w * g for w, g in zip(self.weights, self.grads)) + 0 * x.sum()


def clip_norm_order(ctx: Any) -> dict[str, float]:
    """The global norm each mode's clip reports for gradients [1, b, b, b, b, b, b] with b = 0.875 * 2**-12:
    summed in registration order (torch) the six b**2 vanish one by one next to 1 (the total is 1.0); summed
    the other way round they add up to two ulps of 1 first (the total is 1 + 2**-23). Exact in float32 on
    any CPU: seven values stay in the scalar tail of every vectorized norm kernel, and every square is exact."""
    grads = [1.0] + [0.875 * 2.0**-12] * 6
    out = {}
    for mode in COMM_MODES:
        model, opt = build_comm_mode(Scalars(grads), mode, process_group=ctx.group, **ADAMW)
        model.zero_grad()
        model(torch.zeros(1)).backward()
        out[mode] = float(clip_grad_norm(model, opt, max_norm=10.0))
    return out


def warnings_during_training(ctx: Any) -> list[str]:
    """Every warning raised while training zero1 with an LR scheduler (deprecated collective names, a
    scheduler that believes optimizer.step() was skipped, ...)."""
    import warnings

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for mode in ("overlap", "zero1"):
            model, opt, sched, module = build(ctx, mode)
            run_steps(ctx, model, opt, sched, range(2), 2, clip=1.0)
            if mode == "zero1":
                opt.state_dict()
    return [f"{w.category.__name__}: {w.message}" for w in caught]
