"""Worker scenarios of test_errors.py and test_pool.py: misuse errors, unused parameters, the broadcast on
wrap, and a task that hangs."""

from __future__ import annotations

import os
import time
from typing import Any

import torch
import torch.nn.functional as F
from _workers_common import ADAMW, D_IN, batch, make_model, make_scheduler, params_of, run_steps
from torch import nn
from torch.nn.parallel import DistributedDataParallel
from torch.utils.checkpoint import checkpoint
from vla_overlap import DistributedAdamW, OverlapConfig, OverlapDataParallel


# ------------------------------------------------------------------------------------------ unused params
def unused_params(ctx: Any, allow: bool, skip_rank: int) -> dict[str, Any]:
    """A parameter unused on rank `skip_rank` (-1: used everywhere; 99: unused everywhere)."""
    use_extra = skip_rank not in (ctx.rank, 99)
    module = make_model(unused=True)
    module.use_extra = use_extra
    config = OverlapConfig(bucket_elements=600, allow_unused_params=allow)
    model = OverlapDataParallel(module, config, process_group=ctx.group)
    opt = torch.optim.AdamW(model.trainable_parameters(), **ADAMW)
    try:
        run_steps(ctx, model, opt, make_scheduler(opt), range(2), 2)
    except RuntimeError as error:
        return {"error": str(error)}
    ref_module = make_model(unused=True)
    ref_module.use_extra = use_extra
    ref = DistributedDataParallel(ref_module, process_group=ctx.group, find_unused_parameters=True)
    ref_opt = torch.optim.AdamW([p for p in ref_module.parameters() if p.requires_grad], **ADAMW)
    run_steps(ctx, ref, ref_opt, make_scheduler(ref_opt), range(2), 2)
    return {"ours": params_of(module), "ddp": params_of(ref_module)}


# ---------------------------------------------------------------------------------------- misuse errors
def misuse_errors(ctx: Any) -> dict[str, str]:
    """Each misuse, run on a fresh wrapper, and the message it raised (or 'no error')."""

    def attempt(fn: Any) -> str:
        try:
            fn()
        except (RuntimeError, ValueError, TypeError, NotImplementedError) as error:
            return f"{type(error).__name__}: {error}"
        return "no error"

    def fresh(**config: Any) -> tuple[OverlapDataParallel, nn.Module]:
        module = make_model()
        return OverlapDataParallel(
            module, OverlapConfig(bucket_elements=600, **config), process_group=ctx.group
        ), module

    x, y = batch(0, 0, ctx.rank, ctx.world_size)
    out = {}

    def backward_twice_without_zero() -> None:
        model, _ = fresh()
        model.zero_grad()
        F.mse_loss(model(x), y).backward()
        F.mse_loss(model(x), y).backward()

    out["backward_after_sync"] = attempt(backward_twice_without_zero)

    def second_gradient_after_launch() -> None:
        # embed runs once plainly and once inside a reentrant checkpoint: its gradient arrives twice in one
        # backward, the second time after its bucket (complete after the first) was launched.
        module = make_model()
        module.requires_grad_(False)
        module.embed.requires_grad_(True)
        model = OverlapDataParallel(module, OverlapConfig(bucket_elements=1), process_group=ctx.group)
        model.zero_grad()
        h = module.embed(x)
        h = checkpoint(module.embed, h[:, :D_IN], use_reentrant=True)
        h.sum().backward()

    out["second_gradient"] = attempt(second_gradient_after_launch)

    def frozen_param_in_optimizer() -> None:
        model, module = fresh()
        DistributedAdamW(model, [module.frozen.weight])

    out["frozen_in_optimizer"] = attempt(frozen_param_in_optimizer)

    def two_sharded_optimizers() -> None:
        model, _ = fresh()
        DistributedAdamW(model)
        DistributedAdamW(model)

    out["two_optimizers"] = attempt(two_sharded_optimizers)

    def add_group() -> None:
        model, module = fresh()
        DistributedAdamW(model, [module.head.weight]).add_param_group({"params": [module.head.bias]})

    out["add_param_group"] = attempt(add_group)

    def optimizer_on_plain_module() -> None:
        DistributedAdamW(make_model())  # type: ignore[arg-type]

    out["not_wrapped"] = attempt(optimizer_on_plain_module)

    def load_foreign_state() -> None:
        model, module = fresh()
        opt = DistributedAdamW(model, [module.head.weight])
        opt.load_state_dict(torch.optim.AdamW([module.head.weight]).state_dict())

    out["foreign_state"] = attempt(load_foreign_state)

    def load_other_params() -> None:
        model, module = fresh()
        saved = DistributedAdamW(model, [module.head.weight]).state_dict()
        other, other_module = fresh()
        DistributedAdamW(other, [other_module.head.bias]).load_state_dict(saved)

    out["other_params"] = attempt(load_other_params)

    def everything_frozen() -> None:
        module = make_model()
        module.requires_grad_(False)
        OverlapDataParallel(module, process_group=ctx.group)

    out["nothing_trainable"] = attempt(everything_frozen)
    return out


def broadcast_on_wrap(ctx: Any) -> dict[str, Any]:
    """Ranks start from different weights (and a module buffer); wrapping makes them rank 0's."""
    module = make_model(seed=ctx.rank)
    module.register_buffer("running", torch.full((3,), float(ctx.rank)))
    before = params_of(module)
    OverlapDataParallel(module, OverlapConfig(), process_group=ctx.group)
    return {"before": before, "after": params_of(module)}


def hang_the_first_time(ctx: Any, marker: str) -> int:
    """Rank 0 sleeps far past any deadline unless `marker` exists (it creates it): a hung first attempt."""
    if ctx.rank == 0 and not os.path.exists(marker):
        open(marker, "w").close()
        time.sleep(3600)
    return ctx.rank
