"""`torch.ops.gr00t_model.flash_attention`: the Triton kernels of _attention_kernel as a custom op with autograd.

A `triton_op`, so torch.compile keeps the kernels in its graph (no graph break) and a CUDA graph captures them
like any other kernel. Imported only where Triton runs (CUDA, or Triton's interpreter in tests).
Tensors are [B, S, H, D] (any strides but the last); k and v may have fewer heads than q (grouped queries).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import triton
from torch.library import triton_op, wrap_triton

from . import _attention_kernel as kern


@dataclass(frozen=True)
class Blocks:
    """Tile sizes of one kernel launch."""

    m: int = 64  # query rows per tile
    n: int = 64  # key rows per tile
    warps: int = 4
    stages: int = 2


def head_split(d: int) -> tuple[int, int]:
    """Head dim -> (D1, D2): D1 the largest power of two <= d; D2 covers the rest, a power of two >= 16 or 0."""
    d1 = 1 << (d.bit_length() - 1)
    rest = d - d1
    return d1, 0 if rest == 0 else max(16, 1 << (rest - 1).bit_length())


def forward_blocks(lq: int) -> Blocks:
    """Short query runs fill one 64-row tile; longer ones take 128 rows with 8 warps. (The backward always
    takes Blocks(): 64 x 64 tiles; 32-row query tiles computed a wrong dK under Triton 3.6.)"""
    return Blocks() if lq <= 64 else Blocks(m=128, n=64, warps=8, stages=2)


def supported(q: torch.Tensor, k: torch.Tensor) -> bool:
    """In SDPA's layout (q [B, H, Lq, D], k [B, Hkv, Lk, D]): the shapes the kernels take. Half-precision inputs,
    whole query groups, and a head dim that two column tiles cover exactly (16-256: 48 = 32 + 16, 64, 80, 96,
    128, ...). Where a tile's columns were partly masked (72 as 64 + 16), the forward computed wrong results
    under Triton 3.6 on an H200 (BENCHMARKS.md, levers tried), so such head dims go to SDPA."""
    d = q.shape[-1]
    return (
        16 <= d <= 256
        and sum(head_split(d)) == d
        and q.dtype in (torch.bfloat16, torch.float16)
        and k.dtype == q.dtype
        and q.shape[1] % k.shape[1] == 0
    )


def _unit_last(x: torch.Tensor) -> torch.Tensor:
    return x if x.stride(-1) == 1 else x.contiguous()


def _mask_args(key_mask: torch.Tensor | None, fallback: torch.Tensor) -> tuple[torch.Tensor, int]:
    return (fallback, 0) if key_mask is None else (key_mask, key_mask.stride(0))


def launch_forward(q, k, v, key_mask, causal: bool, scale: float, blocks: Blocks | None = None):
    """(out [B, Lq, H, D] contiguous, lse [B, H, Lq] fp32 in base-2 units)."""
    q, k, v = _unit_last(q), _unit_last(k), _unit_last(v)
    b, lq, heads, d = q.shape
    lk = k.shape[1]
    blocks = blocks or forward_blocks(lq)
    d1, d2 = head_split(d)
    out = torch.empty((b, lq, heads, d), dtype=q.dtype, device=q.device)
    lse = torch.empty((b, heads, lq), dtype=torch.float32, device=q.device)
    keep, smb = _mask_args(key_mask, q)
    wrap_triton(kern._forward_kernel)[(triton.cdiv(lq, blocks.m), b * heads)](
        q, k, v, out, lse, keep,
        q.stride(0), q.stride(1), q.stride(2), k.stride(0), k.stride(1), k.stride(2),
        v.stride(0), v.stride(1), v.stride(2), out.stride(0), out.stride(1), out.stride(2), smb,
        heads, heads // k.shape[2], lq, lk, d,
        SCALE2=scale * math.log2(math.e), D1=d1, D2=d2, BLOCK_M=blocks.m, BLOCK_N=blocks.n,
        HAS_MASK=key_mask is not None, CAUSAL=causal,
        num_warps=blocks.warps, num_stages=blocks.stages,
    )  # fmt: skip
    return out, lse


def launch_backward(
    dout, q, k, v, out, lse, key_mask, causal: bool, scale: float, blocks: Blocks | None = None
):
    """(dq like out, dk, dv [B, Lk, Hkv, D] contiguous)."""
    dout, q, k, v = _unit_last(dout), _unit_last(q), _unit_last(k), _unit_last(v)
    b, lq, heads, d = q.shape
    lk, kv_heads = k.shape[1], k.shape[2]
    blocks = blocks or Blocks()
    d1, d2 = head_split(d)
    dq = torch.empty_like(out)
    dk = torch.empty((b, lk, kv_heads, d), dtype=k.dtype, device=k.device)
    dv = torch.empty_like(dk)
    keep, smb = _mask_args(key_mask, q)
    strides = (
        q.stride(0), q.stride(1), q.stride(2), k.stride(0), k.stride(1), k.stride(2),
        v.stride(0), v.stride(1), v.stride(2), out.stride(0), out.stride(1), out.stride(2),
        dout.stride(0), dout.stride(1), dout.stride(2), smb,
    )  # fmt: skip
    sizes = (heads, heads // kv_heads, lq, lk, d)
    meta = dict(
        SCALE=scale,
        SCALE2=scale * math.log2(math.e),
        D1=d1,
        D2=d2,
        BLOCK_M=blocks.m,
        BLOCK_N=blocks.n,
        HAS_MASK=key_mask is not None,
        CAUSAL=causal,
        num_warps=blocks.warps,
        num_stages=blocks.stages,
    )
    if lq <= blocks.m and kv_heads == heads:  # one program per head: see _short_grads_kernel
        wrap_triton(kern._short_grads_kernel)[(b * heads,)](
            q, k, v, out, dout, lse, keep, dq, dk, dv, *strides, *dk.stride()[:3], *sizes, **meta
        )
        return dq, dk, dv
    wrap_triton(kern._key_grads_kernel)[(triton.cdiv(lk, blocks.n), b * kv_heads)](
        q, k, v, out, dout, lse, keep, dk, dv, *strides, *dk.stride()[:3], *sizes, **meta
    )
    wrap_triton(kern._query_grads_kernel)[(triton.cdiv(lq, blocks.m), b * heads)](
        q, k, v, out, dout, lse, keep, dq, *strides, *sizes, **meta
    )
    return dq, dk, dv


@triton_op("gr00t_model::flash_attention", mutates_args=())
def flash_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    key_mask: torch.Tensor | None,
    causal: bool,
    scale: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    """q [B, Lq, H, D], k/v [B, Lk, Hkv, D], key_mask [B, Lk] bool or None -> (out [B, Lq, H, D], lse)."""
    return launch_forward(q, k, v, key_mask, causal, scale)


@triton_op("gr00t_model::flash_attention_backward", mutates_args=())
def flash_attention_backward(
    dout: torch.Tensor,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    out: torch.Tensor,
    lse: torch.Tensor,
    key_mask: torch.Tensor | None,
    causal: bool,
    scale: float,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    return launch_backward(dout, q, k, v, out, lse, key_mask, causal, scale)


def _setup_context(ctx, inputs, output) -> None:
    q, k, v, key_mask, causal, scale = inputs
    ctx.save_for_backward(q, k, v, output[0], output[1], key_mask)
    ctx.causal, ctx.scale = causal, scale


def _backward(ctx, dout, _dlse):
    q, k, v, out, lse, key_mask = ctx.saved_tensors
    dq, dk, dv = flash_attention_backward(dout, q, k, v, out, lse, key_mask, ctx.causal, ctx.scale)
    return dq, dk, dv, None, None, None


flash_attention.register_autograd(_backward, setup_context=_setup_context)
