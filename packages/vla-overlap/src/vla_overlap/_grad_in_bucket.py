"""Linear layers whose weight-gradient GEMM writes straight into the parameter's gradient buffer.

Without this, autograd computes each weight gradient into a fresh tensor and the post-accumulate hook copies
it into the bucket: one extra pass over every weight gradient per step (2.5 ms for 1.6 B bf16 parameters on an
H200). Here the backward's GEMM takes the bucket view as its output. The weight still receives a gradient,
an uninitialized `empty_like` placeholder (an allocation, no kernel), so AccumulateGrad runs and the
parameter's hook fires as before; the hook drops it without reading it.

A custom op carries the write, not `mm(out=...)` in the backward: under torch.compile, AOTAutograd
functionalizes a plain out= write into a GEMM into a temporary plus a copy, which is the pass this removes,
while a custom op that declares its mutation is re-inplaced by Inductor onto the buffer itself.

Contract (`OverlapDataParallel.write_weight_grads_in_place`; call it before the first forward, before
torch.compile traces): the weight is read only by its own Linear, once per backward (no tied weights, no
second call), and its `.grad` is None when backward starts. Weights held by two Linears are not routed. With
`overwrite_first_grad` (buffers not zeroed at a step's start) the GEMM writes, so a step holds one backward
and a second gradient raises; without it, the GEMM adds into the zeroed buffer (microbatches accumulate).
"""

from __future__ import annotations

import types
from collections import Counter

import torch
import torch.nn.functional as F
from torch import nn

SECOND_GRADIENT = (
    "a second gradient for {name!r} in one step: its GEMM writes the buffer (write_weight_grads_in_place), so "
    "a step holds one backward; to accumulate microbatches use OverlapConfig(overwrite_first_grad=False)"
)


@torch.library.custom_op("vla_overlap::weight_grad_into", mutates_args=("out",))
def weight_grad_into(out: torch.Tensor, grad_out: torch.Tensor, x: torch.Tensor, accumulate: bool) -> None:
    """out (+)= grad_out^T @ x over every leading dimension: the GEMM autograd runs for a Linear's weight."""
    grad_2d = grad_out.reshape(-1, grad_out.shape[-1]).t()
    x_2d = x.reshape(-1, x.shape[-1])
    if accumulate:
        torch.addmm(out, grad_2d, x_2d, out=out)
    else:
        torch.mm(grad_2d, x_2d, out=out)


@weight_grad_into.register_fake
def _(out: torch.Tensor, grad_out: torch.Tensor, x: torch.Tensor, accumulate: bool) -> None:
    return None


class _LinearGradInBucket(torch.autograd.Function):
    @staticmethod
    def forward(x, weight, bias, bucket_view, accumulate):
        return F.linear(x, weight, bias)

    @staticmethod
    def setup_context(ctx, inputs, output):
        x, weight, bias, bucket_view, accumulate = inputs
        ctx.save_for_backward(x, weight, bucket_view)
        ctx.accumulate = accumulate
        ctx.has_bias = bias is not None

    @staticmethod
    def backward(ctx, grad_out):
        x, weight, bucket_view = ctx.saved_tensors
        grad_x = grad_out.matmul(weight) if ctx.needs_input_grad[0] else None
        torch.ops.vla_overlap.weight_grad_into(bucket_view, grad_out, x, ctx.accumulate)
        grad_bias = grad_out.reshape(-1, grad_out.shape[-1]).sum(0) if ctx.has_bias else None
        # The placeholder makes AccumulateGrad run, so the weight's post-accumulate hook fires.
        return grad_x, torch.empty_like(weight), grad_bias, None, None


def own_view(buffer: torch.Tensor) -> torch.Tensor:
    """The same memory as `buffer` (a view of a flat gradient buffer) with a version counter of its own: a
    plain view shares the flat buffer's, which every other parameter's hook bumps, and autograd would then
    refuse the saved view as modified in place."""
    view = torch.empty(0, dtype=buffer.dtype, device=buffer.device)
    view.set_(buffer.untyped_storage(), buffer.storage_offset(), buffer.shape, buffer.stride())
    torch._dynamo.mark_static_address(view)  # under cudagraph trees a non-static input would be copied
    return view


def route_weight_grad(linear: nn.Linear, bucket_view: torch.Tensor, accumulate: bool) -> None:
    """Make `linear`'s weight-gradient GEMM write (accumulate=False) or add (True) into `bucket_view`."""
    if bucket_view.shape != linear.weight.shape or bucket_view.dtype != linear.weight.dtype:
        raise ValueError(
            f"bucket view {tuple(bucket_view.shape)} {bucket_view.dtype} does not match the weight "
            f"{tuple(linear.weight.shape)} {linear.weight.dtype}"
        )
    linear._grad_bucket_view = own_view(bucket_view)
    linear._grad_accumulate = accumulate
    linear.forward = types.MethodType(_forward, linear)


def unroute_weight_grad(linear: nn.Linear) -> None:
    """Undo route_weight_grad: the layer's plain forward again."""
    vars(linear).pop("forward", None)
    for name in ("_grad_bucket_view", "_grad_accumulate"):
        vars(linear).pop(name, None)


def _forward(self: nn.Linear, x: torch.Tensor) -> torch.Tensor:
    weight, bias = self.weight, self.bias
    if not torch.is_grad_enabled() or not weight.requires_grad:
        return F.linear(x, weight, bias)
    device = x.device.type
    if torch.is_autocast_enabled(device):  # cast as autocast would for F.linear, outside the Function
        dtype = torch.get_autocast_dtype(device)
        x, weight = x.to(dtype), weight.to(dtype)
        bias = bias.to(dtype) if bias is not None else None
    if weight is not self.weight:  # its gradient would reach the weight through the cast, not the bucket
        raise RuntimeError(
            f"a Linear routed to write its weight gradient into its bucket got its {self.weight.dtype} weight "
            f"cast to {weight.dtype} by autocast: route only weights stored in the compute dtype"
        )
    return _LinearGradInBucket.apply(x, weight, bias, self._grad_bucket_view, self._grad_accumulate)


def route_linears(module: nn.Module, targets: dict[int, torch.Tensor], accumulate: bool) -> list[nn.Linear]:
    """Route every nn.Linear of `module` whose weight has a target view (by the weight's id) of its own
    dtype, and whose weight no other Linear holds. Returns the routed layers."""
    linears = [m for m in module.modules() if type(m) is nn.Linear]
    holders = Counter(id(linear.weight) for linear in linears)
    routed = []
    for linear in linears:
        key = id(linear.weight)
        target = targets.get(key)
        if target is not None and holders[key] == 1 and target.dtype == linear.weight.dtype:
            route_weight_grad(linear, target, accumulate)
            routed.append(linear)
    return routed


def unroute_linears(routes: list[tuple[nn.Linear, torch.Tensor]]) -> None:
    """Plain layers again, each only if still routed to the given view (another owner may have routed it
    since): when their buffers' owner is gone, nothing would drop the placeholder gradients."""
    for linear, view in routes:
        if vars(linear).get("_grad_bucket_view") is view:
            unroute_weight_grad(linear)
