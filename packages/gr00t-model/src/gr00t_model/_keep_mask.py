"""Dropout keep-masks drawn in one pass: Bernoulli(1 - p) bools, for the DiT's blocks to apply.

On CUDA a Triton kernel draws them: one Philox call gives four 32-bit numbers, each compared against
round(p * 2^32), so the drop probability is p to within 2^-33. torch's `bernoulli_` draws the same
distribution but took 0.45 ms for n1.6-3b's 280 M masks per step on an H200 (BENCHMARKS.md, eleventh
pass). Elsewhere (CPU, or no Triton) `bernoulli_` draws them.
The seed comes from torch's generator (one `randint`), so masks follow `torch.manual_seed`, checkpointed
RNG states and CUDA graph replays (each replay draws a new seed) like any other torch random op.
"""

from __future__ import annotations

import torch


def draw_keep_mask(size: tuple[int, ...], p: float, device: torch.device | str) -> torch.Tensor:
    """A bool tensor of `size`: True (keep) with probability 1 - p, independently per element."""
    if not 0.0 <= p <= 1.0:
        raise ValueError(f"dropout probability must be in [0, 1], got {p}")
    out = torch.empty(size, dtype=torch.bool, device=device)
    kernel = _kernel() if out.is_cuda else None
    if kernel is None:
        return out.bernoulli_(1.0 - p)
    seed = torch.randint(2**62, (1,), dtype=torch.int64, device=out.device)
    kernel.keep_mask(out.view(-1), seed, round(p * 2**32))
    return out


def _kernel():
    """The Triton module, or None where Triton is missing."""
    try:
        from . import _keep_mask_kernel
    except ImportError:
        return None
    return _keep_mask_kernel
