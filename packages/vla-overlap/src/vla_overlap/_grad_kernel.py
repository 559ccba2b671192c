"""Triton kernel of accumulate_into: an fp32 gradient buffer set to, or increased by, a bf16/fp16 gradient."""

from __future__ import annotations

import triton
import triton.language as tl

BLOCK = 4096


@triton.jit
def _accumulate_kernel(dst_ptr, src_ptr, n, FIRST: tl.constexpr, BLOCK: tl.constexpr):
    offsets = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    inside = offsets < n
    value = tl.load(src_ptr + offsets, mask=inside).to(tl.float32)
    if not FIRST:
        value += tl.load(dst_ptr + offsets, mask=inside)
    tl.store(dst_ptr + offsets, value, mask=inside)


def accumulate(target, grad, first: bool) -> None:
    """target (fp32, contiguous) = grad, or += grad (any float dtype, contiguous, same numel)."""
    n = target.numel()
    if n:
        _accumulate_kernel[(triton.cdiv(n, BLOCK),)](target, grad, n, FIRST=first, BLOCK=BLOCK, num_warps=8)
