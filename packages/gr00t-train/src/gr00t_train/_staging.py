"""Copies of a checkpoint's state in host memory, taken on the main thread after the update finished, so a
background thread can write them while training changes the originals.

On CUDA every device tensor is copied into pinned host memory by a non-blocking copy on the current stream:
the host does not wait, and every later kernel that could change the original is queued behind the copy (one
stream, so no cross-stream hazard); an event recorded after the copies is what the writer waits on before it
reads them. With the optimizer on a side stream, `Trainer.save` made the current stream wait for the update
first, and the next update's stream waits for the current one (vla_overlap.UpdateStream.side): the copies
sit between two updates. CPU tensors are cloned, unless the caller says they are fresh (made for this save, as ZeRO-1's
gathered optimizer state is), in which case they are kept as they are.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

import torch


def stage(tree: Any, *, fresh_cpu: bool = False) -> tuple[Any, Callable[[], None]]:
    """(`tree` with every tensor copied into host memory, a function that waits until the copies are done).
    Dicts, lists and tuples are rebuilt; other leaves are deep-copied."""
    copies: list[bool] = []

    def visit(node: Any) -> Any:
        if isinstance(node, torch.Tensor):
            if node.device.type == "cuda":
                copies.append(True)
                host = torch.empty(node.shape, dtype=node.dtype, pin_memory=True)
                return host.copy_(node.detach(), non_blocking=True)
            return node if fresh_cpu else node.detach().clone()
        if isinstance(node, dict):
            return {key: visit(value) for key, value in node.items()}
        if isinstance(node, (list, tuple)):
            items = [visit(value) for value in node]
            return items if isinstance(node, list) else tuple(items)
        return copy.deepcopy(node)

    staged = visit(tree)
    if not copies:
        return staged, lambda: None
    done = torch.cuda.Event()
    done.record()  # after every copy above, on the current stream
    return staged, done.synchronize
