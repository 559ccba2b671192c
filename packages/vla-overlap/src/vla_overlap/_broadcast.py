"""Rank 0's parameters and buffers to every rank, once, when a wrapper is built."""

from __future__ import annotations

import torch
from torch import nn

from ._comm import Communicator

_BROADCAST_CHUNK_BYTES = 256 * 2**20


def broadcast_module_states(module: nn.Module, comm: Communicator) -> None:
    """Overwrite every parameter (frozen ones too) and buffer with the group's first rank's values, a few
    large collectives per dtype instead of one per tensor."""
    tensors = [p.data for p in module.parameters()] + list(module.buffers())
    groups: dict[tuple[torch.dtype, torch.device], list[torch.Tensor]] = {}
    for tensor in tensors:
        groups.setdefault((tensor.dtype, tensor.device), []).append(tensor)
    with torch.no_grad():
        for group in groups.values():
            chunk: list[torch.Tensor] = []
            size = 0
            for i, tensor in enumerate(group):
                chunk.append(tensor)
                size += tensor.numel() * tensor.element_size()
                if size >= _BROADCAST_CHUNK_BYTES or i == len(group) - 1:
                    _broadcast_chunk(chunk, comm)
                    chunk, size = [], 0


def _broadcast_chunk(chunk: list[torch.Tensor], comm: Communicator) -> None:
    """One collective for many tensors of a dtype: flatten, broadcast, copy back."""
    flat = torch.cat([t.reshape(-1) for t in chunk])
    comm.broadcast_now(flat)
    offset = 0
    for t in chunk:
        t.copy_(flat[offset : offset + t.numel()].view_as(t))
        offset += t.numel()
