"""The DiT's VL context cast once for all its cross-attention blocks (`CAST_ONCE`).

Under autocast each cross block's k and v projections cast the fp32 context to bf16 themselves: 16 casts of
[B, S, 2048] per step, and in the backward each block widens and sums its two input gradients to fp32 and
autograd adds that into the running sum over blocks (32.5 us per cross block of n1.6-3b on an H200,
BENCHMARKS.md, levers tried). Here the context is cast once; each projection gets its own view of the copy,
so its gradient reaches `ContextCast.backward` separately, where one pass (one fused kernel once compiled)
widens and sums all of them in fp32 in the order the compiled blocks and autograd did: each block's k + v,
then from the last block back to the first.
"""

from __future__ import annotations

import torch

CAST_ONCE = True
"""+2 samples/s for n1.6-3b on an H200 (BENCHMARKS.md, levers tried; off: the step-variant row
`ours-full-cast-context-per-block`)."""


def applies(context: torch.Tensor) -> bool:
    """Whether autocast would cast `context` to a narrower dtype for the projections."""
    kind = context.device.type
    return (
        CAST_ONCE
        and context.dtype == torch.float32
        and kind in ("cuda", "cpu")  # autocast's query raises on others (the meta device)
        and torch.is_autocast_enabled(kind)
        and torch.get_autocast_dtype(kind) in (torch.bfloat16, torch.float16)
    )


def cast_for_blocks(
    context: torch.Tensor, blocks: int, grad_sum=None
) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """(k input, v input) per cross block: views of one cast of `context` to autocast's dtype. `grad_sum` sums
    the gradients (`sum_grads` or a compiled form of it)."""
    views = ContextCast.apply(context, 2 * blocks, torch.get_autocast_dtype(context.device.type), grad_sum)
    return [(views[2 * i], views[2 * i + 1]) for i in range(blocks)]


def sum_grads(*grads: torch.Tensor) -> torch.Tensor:
    """fp32 sum of (k, v) gradient pairs given in block order: each pair widened and added, then the pairs
    summed from the last block back to the first (the order in which their backward passes deliver them)."""
    total = grads[-2].float() + grads[-1].float()
    for at in range(len(grads) - 4, -1, -2):
        total = total + (grads[at].float() + grads[at + 1].float())
    return total


class ContextCast(torch.autograd.Function):
    """Views of one cast; the gradients of unused views arrive as zeros (autograd materializes them)."""

    @staticmethod
    def forward(ctx, context, copies, dtype, grad_sum):
        ctx.grad_sum = grad_sum or sum_grads
        low = context.to(dtype)
        return tuple(low.view_as(low) for _ in range(copies))

    @staticmethod
    def backward(ctx, *grads):
        return ctx.grad_sum(*grads), None, None, None
