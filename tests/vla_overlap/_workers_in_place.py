"""Worker scenarios of weight gradients written into the buffers by their GEMMs (write_weight_grads_in_place)."""

from __future__ import annotations

import contextlib
import copy
import gc
from typing import Any

import torch
import torch.nn.functional as F
from _workers_common import batch, make_model
from vla_overlap import OverlapConfig, OverlapDataParallel


def _config(**overrides: Any) -> OverlapConfig:
    # grad_reduce_dtype=None: buffers in the weights' own dtype, the only ones a GEMM can write into
    return OverlapConfig(bucket_elements=600, grad_reduce_dtype=None, **overrides)


def _backward(model: Any, ctx: Any, micro: int = 0) -> None:
    x, y = batch(0, micro, ctx.rank, ctx.world_size)
    F.mse_loss(model(x), y).backward()


def in_place_equals_copies(ctx: Any, micro: int = 1) -> dict[str, Any]:
    """One step of `micro` microbatches with and without in-place weight gradients; the reduced buffers.
    With several microbatches the buffers are zeroed at the step's start and the GEMMs add into them."""
    grads, routed = [], 0
    for in_place in (False, True):
        model = OverlapDataParallel(
            make_model(), _config(overwrite_first_grad=micro == 1), process_group=ctx.group
        )
        if in_place:
            routed = model.write_weight_grads_in_place()
        model.zero_grad_buffer()
        for m in range(micro):
            with model.no_sync() if m < micro - 1 else contextlib.nullcontext():
                _backward(model, ctx, m)
        grads.append([p.main_grad.clone() for p in model.trainable_parameters()])
    return {"routed": routed, "plain": grads[0], "in_place": grads[1]}


def in_place_second_backward_raises(ctx: Any) -> dict[str, Any]:
    """Writing GEMMs hold one backward per step: a second gradient in the step must raise, not overwrite."""
    model = OverlapDataParallel(make_model(), _config(), process_group=ctx.group)
    model.write_weight_grads_in_place()
    model.zero_grad_buffer()
    with model.no_sync():
        _backward(model, ctx)
    try:
        with model.no_sync():
            _backward(model, ctx)
    except RuntimeError as error:
        return {"raised": str(error)}
    return {"raised": None}


def in_place_outlived_by_the_module(ctx: Any) -> dict[str, Any]:
    """The module outlives its wrapper: its layers are plain again, so backward gives real `.grad`s (a routed
    layer would leave an uninitialized placeholder there, with no hook left to drop it)."""
    module = make_model()
    reference = copy.deepcopy(module)
    model = OverlapDataParallel(module, _config(), process_group=ctx.group)
    routed = model.write_weight_grads_in_place()
    del model
    gc.collect()
    for each in (module, reference):
        _backward(each, ctx)
    pairs = [(a, b) for a, b in zip(module.parameters(), reference.parameters()) if a.requires_grad]
    return {
        "routed": routed,
        "plain": all("forward" not in vars(m) for m in module.modules()),
        "equal": all(torch.equal(a.grad, b.grad) for a, b in pairs),
    }


def in_place_rewrapped(ctx: Any) -> dict[str, Any]:
    """A module wrapped again: when the first wrapper is collected, the layers stay routed to the second's
    buffers (the first must not undo routes it no longer owns), which then hold the plain path's gradients."""
    module = make_model()
    reference = OverlapDataParallel(copy.deepcopy(module), _config(), process_group=ctx.group)
    first = OverlapDataParallel(module, _config(), process_group=ctx.group)
    first.write_weight_grads_in_place()
    second = OverlapDataParallel(module, _config(), process_group=ctx.group)
    routed = second.write_weight_grads_in_place()
    del first
    gc.collect()
    for wrapped in (second, reference):
        wrapped.zero_grad_buffer()
        _backward(wrapped, ctx)
    pairs = zip(second.trainable_parameters(), reference.trainable_parameters())
    return {"routed": routed, "equal": all(torch.equal(a.main_grad, b.main_grad) for a, b in pairs)}
