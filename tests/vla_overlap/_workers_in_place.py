"""Worker scenarios of weight gradients written into the buffers by their GEMMs (write_weight_grads_in_place)."""

from __future__ import annotations

import copy
import gc
from typing import Any

import torch
import torch.nn.functional as F
from _workers_common import batch, make_model
from vla_overlap import OverlapConfig, OverlapDataParallel


def _wrapped(ctx: Any, in_place: bool, **config: Any) -> tuple[OverlapDataParallel, int]:
    # grad_reduce_dtype=None: buffers in the weights' own dtype, the only ones a GEMM can write into
    config = OverlapConfig(bucket_elements=600, grad_reduce_dtype=None, **config)
    model = OverlapDataParallel(make_model(), config, process_group=ctx.group)
    return model, model.write_weight_grads_in_place() if in_place else 0


def in_place_equals_copies(ctx: Any, micro: int = 1) -> dict[str, Any]:
    """One step of `micro` microbatches with and without in-place weight gradients; the reduced buffers.
    With several microbatches the buffers are zeroed at the step's start and the GEMMs add into them."""
    grads, routed = [], 0
    for in_place in (False, True):
        model, count = _wrapped(ctx, in_place, overwrite_first_grad=micro == 1)
        routed = max(routed, count)
        model.zero_grad_buffer()
        for m in range(micro):
            x, y = batch(0, m, ctx.rank, ctx.world_size)
            if m < micro - 1:
                with model.no_sync():
                    F.mse_loss(model(x), y).backward()
            else:
                F.mse_loss(model(x), y).backward()
        grads.append([p.main_grad.clone() for p in model.trainable_parameters()])
    return {"routed": routed, "plain": grads[0], "in_place": grads[1]}


def in_place_second_backward_raises(ctx: Any) -> dict[str, Any]:
    """Writing GEMMs hold one backward per step: a second gradient in the step must raise, not overwrite."""
    model, _ = _wrapped(ctx, True)
    model.zero_grad_buffer()
    x, y = batch(0, 0, ctx.rank, ctx.world_size)
    with model.no_sync():
        F.mse_loss(model(x), y).backward()
    try:
        with model.no_sync():
            F.mse_loss(model(x), y).backward()
    except RuntimeError as error:
        return {"raised": str(error)}
    return {"raised": None}


def in_place_outlived_by_the_module(ctx: Any) -> dict[str, Any]:
    """The module outlives its wrapper: its layers are plain again, so backward gives real `.grad`s (a routed
    layer would leave an uninitialized placeholder there, with no hook left to drop it)."""
    module = make_model()
    reference = copy.deepcopy(module)
    config = OverlapConfig(bucket_elements=600, grad_reduce_dtype=None)
    model = OverlapDataParallel(module, config, process_group=ctx.group)
    routed = model.write_weight_grads_in_place()
    del model
    gc.collect()
    x, y = batch(0, 0, ctx.rank, ctx.world_size)
    for each in (module, reference):
        F.mse_loss(each(x), y).backward()
    pairs = [(a, b) for a, b in zip(module.parameters(), reference.parameters()) if a.requires_grad]
    return {
        "routed": routed,
        "plain": all("forward" not in vars(m) for m in module.modules()),
        "equal": all(torch.equal(a.grad, b.grad) for a, b in pairs),
    }


def in_place_rewrapped(ctx: Any) -> dict[str, Any]:
    """A module wrapped again: when the first wrapper is collected, the layers stay routed to the second's
    buffers (the first must not undo routes it no longer owns), which then hold the plain path's gradients."""
    config = OverlapConfig(bucket_elements=600, grad_reduce_dtype=None)
    module = make_model()
    reference = OverlapDataParallel(copy.deepcopy(module), config, process_group=ctx.group)
    first = OverlapDataParallel(module, config, process_group=ctx.group)
    first.write_weight_grads_in_place()
    second = OverlapDataParallel(module, config, process_group=ctx.group)
    routed = second.write_weight_grads_in_place()
    del first
    gc.collect()
    x, y = batch(0, 0, ctx.rank, ctx.world_size)
    for wrapped in (second, reference):
        wrapped.zero_grad_buffer()
        F.mse_loss(wrapped(x), y).backward()
    pairs = zip(second.trainable_parameters(), reference.trainable_parameters())
    return {"routed": routed, "equal": all(torch.equal(a.main_grad, b.main_grad) for a, b in pairs)}
