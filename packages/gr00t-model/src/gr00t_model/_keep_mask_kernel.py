"""The Triton kernel of _keep_mask (imported only when a CUDA mask is drawn)."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

QUARTER = 1024  # Philox calls per program; each writes 4 * QUARTER masks


@triton.jit
def _keep_mask_kernel(out_ptr, seed_ptr, n, threshold, QUARTER: tl.constexpr):
    program = tl.program_id(0).to(tl.int64)
    lanes = tl.arange(0, QUARTER)
    # One counter per lane; its four numbers go to four contiguous quarters of the program's span, so every
    # store is coalesced. Which number lands where does not matter: all are independent draws.
    r0, r1, r2, r3 = tl.randint4x(tl.load(seed_ptr), program * QUARTER + lanes)
    at = program * (4 * QUARTER) + lanes
    tl.store(out_ptr + at, r0 >= threshold, mask=at < n)
    tl.store(out_ptr + at + QUARTER, r1 >= threshold, mask=at + QUARTER < n)
    tl.store(out_ptr + at + 2 * QUARTER, r2 >= threshold, mask=at + 2 * QUARTER < n)
    tl.store(out_ptr + at + 3 * QUARTER, r3 >= threshold, mask=at + 3 * QUARTER < n)


def keep_mask(out: torch.Tensor, seed: torch.Tensor, threshold: int, quarter: int = QUARTER) -> None:
    """Fill the flat bool `out`: element i keeps (True) when its 32-bit draw under `seed` ([1] int64 on the
    device) is >= `threshold` (round(p * 2^32) for a drop probability p)."""
    n = out.numel()
    if n:
        _keep_mask_kernel[(triton.cdiv(n, 4 * quarter),)](out, seed, n, threshold, QUARTER=quarter)
