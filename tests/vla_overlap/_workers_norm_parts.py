"""Worker functions of test_norm_parts.py: DistributedAdamW(norm_in_backward=True) against the norm taken
after the backward."""

from __future__ import annotations

from typing import Any

import torch
from _workers_common import ADAMW, bf16_model, make_scheduler, param_groups, params_of, run_steps
from vla_overlap import DistributedAdamW, OverlapConfig, OverlapDataParallel


def norm_in_backward(ctx: Any, steps: int = 3, micro: int = 2, reduce_dtype: str | None = None) -> dict:
    """The same run with the norm's parts taken in the backward and without: norms, parameters, and how
    often the pass after the backward (FlatAdamW.grad_norm) ran. `reduce_dtype="bfloat16"`: the buckets
    travel through a narrower wire, where no part is taken."""
    wire = getattr(torch, reduce_dtype) if reduce_dtype else None
    out = {}
    for parts in (False, True):
        module = bf16_model(mixed=True)
        config = OverlapConfig(bucket_elements=600, reduce_dtype=wire)
        model = OverlapDataParallel(module, config, process_group=ctx.group)
        opt = DistributedAdamW(model, param_groups(module), **ADAMW, flat="torch", norm_in_backward=parts)
        passes: list[float] = []

        def counted(norm_type: float, plain=opt.flat.grad_norm, passes=passes) -> torch.Tensor:
            passes.append(norm_type)
            return plain(norm_type)

        opt.flat.grad_norm = counted
        norms = run_steps(ctx, model, opt, make_scheduler(opt), range(steps), micro, autocast=True,
                          clip=0.05, dtype=torch.bfloat16)  # fmt: skip
        out[str(parts)] = {
            "params": params_of(module),
            "norms": norms,
            "passes_after_backward": len(passes),
            "buckets": len(opt.flat.buckets),
        }
    return out


def norm_in_backward_by_hand(ctx: Any) -> dict:
    """Gradients written into the buffers by hand after zero_grad (no hooks fire): the buckets launch when
    clip_grad_norm_ finishes the sync, and their parts are taken then, not left from the last backward."""
    module = bf16_model(mixed=True)
    model = OverlapDataParallel(module, OverlapConfig(bucket_elements=600), process_group=ctx.group)
    opt = DistributedAdamW(model, param_groups(module), **ADAMW, flat="torch", norm_in_backward=True)
    run_steps(ctx, model, opt, make_scheduler(opt), range(1), 1, autocast=True, clip=0.05,
              dtype=torch.bfloat16)  # fmt: skip
    model.zero_grad()
    for grad in model._grads.main_grads:
        grad.fill_(0.5)
    from_parts = opt.clip_grad_norm_(1e9)  # coefficient 1: the gradients stay as they are
    parts, opt._norm_parts = opt._norm_parts, None
    after_backward = opt.clip_grad_norm_(1e9)
    return {"from_parts": float(from_parts), "after_backward": float(after_backward),
            "parts_taken": parts.grads.after_reduce_ran_for_all}  # fmt: skip
