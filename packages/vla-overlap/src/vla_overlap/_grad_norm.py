"""The clipping norm of FlatAdamW's gradient shards, in one part per shard.

`part_of_norm` takes one shard's part (its sum of squares by the Triton kernel for the 2-norm, its fp32 norm
otherwise) and `combine_parts` makes the norm from the parts, the same way for every shard.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    from ._flat_adamw import FlatAdamW


def part_of_norm(flat: FlatAdamW, bucket: int, norm_type: float = 2.0) -> torch.Tensor:
    """One shard's part: its sum of squares (the Triton kernel, 2-norm) or its norm (fp32)."""
    grad = flat.buckets[bucket]["grad"]
    if flat.kernel == "triton" and norm_type == 2.0:
        from ._flat_adamw_kernel import sum_of_squares

        return sum_of_squares(grad)
    return torch.linalg.vector_norm(grad, norm_type, dtype=torch.float32)


def combine_parts(flat: FlatAdamW, parts: torch.Tensor, norm_type: float = 2.0) -> torch.Tensor:
    """The norm from the shards' parts ([shards] fp32)."""
    if flat.kernel == "triton" and norm_type == 2.0:
        return parts.sum().sqrt()
    return torch.linalg.vector_norm(parts, norm_type)
