"""The gradient norm's per-bucket parts, taken as the backward reduces each bucket (`norm_in_backward`).

Clipping by the global norm needs every gradient before any update can start. Taken after the backward, the
norm is one more pass over all gradients (3.2 GB of bf16 for n1.6-3b) that runs alone, between the backward
and the update. Here each bucket's part (FlatAdamW.norm_part: the same kernel on the same shard) is taken on
the comm stream right after that bucket's collective, beside the rest of the backward, and clip_grad_norm_
only combines the parts, as FlatAdamW.grad_norm does: the norm is bitwise the same.

Contract: nothing changes the gradients between the backward and clip_grad_norm_ (a change would not be seen
by the norm). A step in which some bucket's part was not taken (a bucket reduced through a narrower wire
dtype, a step without the hooks) falls back to the pass after the backward.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    from ._flat_adamw import FlatAdamW
    from ._grad_buckets import GradBuckets


class NormParts:
    """Takes each bucket's norm part as the bucket is reduced; `norm()` combines them."""

    def __init__(self, flat: FlatAdamW, grads: GradBuckets, norm_type: float = 2.0) -> None:
        self.flat, self.grads, self.norm_type = flat, grads, float(norm_type)
        device = flat.buckets[0]["grad"].device
        # persistent: a CUDA graph bakes its address into the copies it captures
        self.parts = torch.zeros(len(flat.buckets), dtype=torch.float32, device=device)
        grads.after_reduce = self._take

    def _take(self, bucket: int, reduced: torch.Tensor) -> None:
        if reduced.data_ptr() != self.flat.buckets[bucket]["grad"].data_ptr():
            raise RuntimeError("norm_in_backward: the reduced shard is not the gradient the step reads")
        self.parts[bucket].copy_(self.flat.norm_part(reduced, self.norm_type))

    def norm(self, norm_type: float) -> torch.Tensor | None:
        """This rank's gradient norm from the parts of this step, or None where a part is missing."""
        if float(norm_type) != self.norm_type or not self.grads.after_reduce_ran_for_all:
            return None
        return self.flat.norm_of_parts(self.parts, self.norm_type)
