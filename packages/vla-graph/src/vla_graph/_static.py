"""Static input buffers: a graph reads its inputs from fixed addresses, so each new batch is copied in."""

from __future__ import annotations

from typing import Any

import torch

from ._errors import ShapeChangeError
from ._tree import copy_into, describe_difference, map_tree, signature


class StaticInputs:
    """Fixed-address copies of one batch (a nested dict/list/tuple of tensors) on one device.

    Allocate once from a template batch, hand `tree` to the code being captured, then `fill` each new
    batch before a replay. A batch whose shape, dtype, device (of any tensor) or Python values differ
    from the template raises ShapeChangeError naming the key."""

    def __init__(self, template: Any, device: torch.device | str, *, name: str = "batch") -> None:
        self.name = name
        self.device = torch.device(device)
        self.signature = signature(template, name)
        self.tree: Any = map_tree(self._allocate, template)

    def _allocate(self, leaf: Any) -> Any:
        if not isinstance(leaf, torch.Tensor):
            return leaf
        # Outside any graph pool: these addresses must stay valid for every later replay.
        return torch.empty(leaf.shape, dtype=leaf.dtype, device=self.device)

    def matches(self, batch: Any) -> bool:
        """Whether `batch` can be copied in (same keys, shapes, dtypes, devices and Python values)."""
        return signature(batch, self.name) == self.signature

    def fill(self, batch: Any) -> Any:
        """Copy `batch` into the static buffers (asynchronously, on the current stream) and return `tree`."""
        got = signature(batch, self.name)
        if got != self.signature:
            lines = describe_difference(self.signature, got)
            raise ShapeChangeError(
                f"{self.name} does not match the captured graph: "
                + "; ".join(lines)
                + ". Pad batches to fixed shapes (vla_graph.pad_dim / pad_batch) or use "
                "GraphConfig(on_shape_change='recapture')."
            )
        copy_into(self.tree, batch)
        return self.tree
