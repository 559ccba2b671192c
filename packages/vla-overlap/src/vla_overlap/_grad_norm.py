"""The clipping norm of FlatAdamW's gradient shards, in one part per shard, and EarlyNorm, which takes the parts
inside the backward, as each bucket's gradient is final.

FlatAdamW's step reads every gradient once more for the norm after the backward (3.2 GB for n1.6-3b: 1.2 ms on
an H200), on the optimizer's side stream, where it takes turns with the next step's frozen forward. At one rank
a bucket's gradient is final when the bucket launches (GradBuckets.on_launch), so its part can be taken then,
on the comm stream, while the rest of the backward runs small kernels that leave the memory bandwidth idle.
The parts are the very numbers computed late (the same kernel per shard, combined the same way), so the norm
is equal bit for bit. A replayed CUDA graph that captured the launches recomputes the parts with them.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    from ._flat_adamw import FlatAdamW
    from ._grad_buckets import GradBuckets


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


class EarlyNorm:
    """The 2-norm's parts, taken as GradBuckets launches each bucket."""

    def __init__(self, flat: FlatAdamW, grads: GradBuckets) -> None:
        self.flat, self.grads = flat, grads
        device = flat.buckets[0]["grad"].device
        self.parts = torch.zeros(len(flat.buckets), dtype=torch.float32, device=device)  # fixed: graphs
        grads.on_launch = self._take

    def _take(self, bucket: int) -> None:
        self.parts[bucket].copy_(part_of_norm(self.flat, bucket))

    def norm(self, norm_type: float) -> torch.Tensor | None:
        """This step's norm from its parts; None when a part may be stale (another norm type, or a bucket not
        launched since the buffers were last reset): the caller then reads the gradients."""
        if norm_type != 2.0 or not self.grads.all_launched:
            return None
        return combine_parts(self.flat, self.parts)
