"""Worker scenarios of gradients written straight into the buffers (a replayed CUDA graph) and of the
bf16 wire dtype."""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from _workers_common import ADAMW, batch, make_model
from vla_overlap import DistributedAdamW, OverlapConfig, OverlapDataParallel


def replayed_buffers(ctx: Any) -> dict[str, Any]:
    """What a replayed CUDA graph leaves: gradients written into the buffers with no hook firing (Python did
    not run), then the eager sync. The buffers are not zeroed at the step's start (overwrite_first_grad),
    and the sync must not mistake them for stale values."""
    module = make_model()
    model = OverlapDataParallel(module, OverlapConfig(bucket_elements=600), process_group=ctx.group)
    params = model.trainable_parameters()
    x, y = batch(0, 0, ctx.rank, ctx.world_size)
    F.mse_loss(model(x), y).backward()  # one ordinary step first, so the buffers hold old values
    model.zero_grad_buffer()
    written = []
    for index, p in enumerate(params):
        value = torch.full_like(p.main_grad, float(index + 1 + ctx.rank))
        p.main_grad.copy_(value)
        written.append(value)
    model.start_grad_sync()
    model.finish_grad_sync()
    mean = [w - ctx.rank + (ctx.world_size - 1) / 2 for w in written]
    return {"ok": all(torch.equal(p.main_grad, m) for p, m in zip(params, mean))}


def bf16_wire(ctx: Any, sharded: bool) -> dict[str, Any]:
    """Gradients accumulated in fp32 and reduced in bf16 (OverlapConfig.reduce_dtype): what each rank gets
    vs the mean computed the way the wire computes it (each rank's 1/world-scaled fp32 bucket rounded to
    bf16, summed in bf16), from every rank's known gradients."""
    module = make_model()
    config = OverlapConfig(bucket_elements=600, reduce_dtype=torch.bfloat16, overwrite_first_grad=False)
    model = OverlapDataParallel(module, config, process_group=ctx.group)
    if sharded:
        DistributedAdamW(model, **ADAMW)
    params = model.trainable_parameters()

    def grads_of(rank: int) -> list[torch.Tensor]:
        gen = torch.Generator().manual_seed(100 + rank)
        return [torch.randn(p.shape, generator=gen) for p in params]

    model.zero_grad_buffer()
    for p, g in zip(params, grads_of(ctx.rank)):
        p.main_grad.add_(g)
    model.start_grad_sync()
    model.finish_grad_sync()
    assert all(w is None or w.dtype == torch.bfloat16 for w in model._grads.wire)
    total = None
    for rank in range(ctx.world_size):
        scaled = [(g * (1.0 / ctx.world_size)).bfloat16() for g in grads_of(rank)]
        total = (
            scaled if total is None else [(t.float() + s.float()).bfloat16() for t, s in zip(total, scaled)]
        )
    expected = [t.float() for t in total]
    layout = model.layout
    ok = True
    for p, want in zip(params, expected):
        if sharded:  # only this rank's shard of each bucket is reduced, into the shard buffer
            where = layout.slots[model._slot_of[id(p)]]
            lo, hi = layout.buckets[where.bucket].shard_range(ctx.rank, ctx.world_size)
            first, last = max(lo, where.start), min(hi, where.start + where.numel)
            if first >= last:
                continue
            got = model._grads.shard_view(where.bucket)[first - lo : last - lo]
            ok &= torch.equal(got, want.reshape(-1)[first - where.start : last - where.start])
        else:
            ok &= torch.equal(p.main_grad, want)
    return {"ok": bool(ok)}
