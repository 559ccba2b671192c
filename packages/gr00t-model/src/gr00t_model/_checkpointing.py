"""Activation checkpointing of the trainable blocks (GR00TConfig.checkpoint_blocks): a block's forward keeps
only its inputs, and its backward runs the forward again to get what it needs (torch.utils.checkpoint,
non-reentrant). The recomputation is the same computation on the same inputs, so losses and gradients do not
change: the blocks draw no random numbers of their own (the DiT's dropout masks come in as inputs, drawn
once per step), which is also why the random state is not saved and restored around the recomputation (that
would read the CUDA generator's state, which a CUDA graph capture forbids)."""

from __future__ import annotations

from typing import Any

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint


def run_block(block: nn.Module, *args: Any, recompute: bool, **kwargs: Any) -> Any:
    """`block(*args, **kwargs)`, with its activations recomputed in the backward when `recompute` and a
    backward will need them (gradients on, and the block trains or its input carries a gradient)."""
    if recompute and torch.is_grad_enabled() and _needs_backward(block, args):
        return checkpoint(block, *args, use_reentrant=False, preserve_rng_state=False, **kwargs)
    return block(*args, **kwargs)


def _needs_backward(block: nn.Module, args: tuple) -> bool:
    if any(isinstance(a, torch.Tensor) and a.requires_grad for a in args):
        return True
    return any(p.requires_grad for p in block.parameters())
