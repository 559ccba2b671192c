"""Vectorized copies between float dtypes (bf16/fp16 gradients into fp32 buffers, fp32 masters into bf16
parameters) as one Triton kernel, used on CUDA by `cast_into`.

torch runs a mixed-dtype `copy_` or `add_` through its unvectorized elementwise path: about a quarter of the
H200's bandwidth over the ~700 tensors of each step. The arithmetic is the same (widening is exact, the add
rounds once in fp32, narrowing rounds to nearest even as torch does), so results equal torch's bit for bit.
"""

from __future__ import annotations

import functools

import torch

BLOCK = 2048
_NARROW = (torch.bfloat16, torch.float16)


def cast_into(target: torch.Tensor, source: torch.Tensor, add: bool = False) -> None:
    """target = source, or target += source (fp32 targets only), converting dtypes."""
    if _kernel_applies(target, source, add):
        _launch(target, source, add)
    elif add:
        target.add_(source)
    else:
        target.copy_(source)


def _kernel_applies(target: torch.Tensor, source: torch.Tensor, add: bool) -> bool:
    pair = (source.dtype, target.dtype)
    widening = pair[0] in _NARROW and pair[1] == torch.float32
    narrowing = pair == (torch.float32, torch.bfloat16) or pair == (torch.float32, torch.float16)
    return (
        target.is_cuda
        and (widening or (narrowing and not add))
        and source.device == target.device
        and source.numel() == target.numel()
        and target.is_contiguous()
        and source.is_contiguous()
        and _triton() is not None
    )


@functools.cache
def _triton():
    """The compiled kernel, or None without Triton (it ships with CUDA builds of torch)."""
    try:
        import triton
        import triton.language as tl
    except ImportError:
        return None

    @triton.jit
    def kernel(dst_ptr, src_ptr, n, ADD: tl.constexpr, BLOCK: tl.constexpr):
        offsets = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
        inside = offsets < n
        value = tl.load(src_ptr + offsets, mask=inside).to(tl.float32)
        if ADD:
            value = tl.load(dst_ptr + offsets, mask=inside) + value
        tl.store(dst_ptr + offsets, value.to(dst_ptr.dtype.element_ty), mask=inside)

    return kernel, triton.cdiv


def _launch(target: torch.Tensor, source: torch.Tensor, add: bool) -> None:
    n = target.numel()
    if n:
        kernel, cdiv = _triton()
        kernel[(cdiv(n, BLOCK),)](target, source, n, ADD=add, BLOCK=BLOCK, num_warps=4)
