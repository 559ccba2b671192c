"""Activation checkpointing of the trainable blocks (GR00TConfig.checkpoint_blocks), under one of two policies
(GR00TConfig.checkpoint_policy):

- "full": a block's forward keeps only its inputs, and its backward runs the whole forward again.
- "selective": the forward also keeps the outputs of the expensive ops (`SAVED_OPS`: GEMMs and attention), and
  the backward recomputes only the cheap ones between them (norms, activations, elementwise products, views),
  through torch.utils.checkpoint's selective checkpointing (`create_selective_checkpoint_contexts`).

Either way it is torch.utils.checkpoint, non-reentrant: the recomputation is the same computation on the same
inputs, so losses and gradients do not change. The blocks draw no random numbers of their own (the DiT's
dropout masks come in as inputs, drawn once per step), which is also why the random state is not saved and
restored around the recomputation (that would read the CUDA generator's state, which a CUDA graph capture
forbids).

A compiled block (`GR00TN16.compile_blocks`) compiles the checkpoint with it, under either policy
(`checkpointed_forward`): torch.compile reads the policy, its partitioner keeps what the policy saves, and the
compiled backward graph does the recomputation. An eager checkpoint around a compiled block would instead run
the compiled forward again from the backward, where torch.compile may not run it: under a TorchDispatchMode
(FlopCounterMode, op counters) Dynamo skips the frame and the eager forward runs, saving other tensors than the
compiled one did, and torch.utils.checkpoint stops with "Recomputed values ... have different metadata". The
selective policy would also see only the compiled kernels there, not the ops it chooses among."""

from __future__ import annotations

import functools
import types
from typing import Any

import torch
from torch import nn
from torch.utils.checkpoint import CheckpointPolicy, checkpoint, create_selective_checkpoint_contexts

from ._config import CHECKPOINT_POLICIES

SAVED_OPS = frozenset({
    "aten::mm", "aten::addmm", "aten::bmm", "aten::baddbmm", "aten::_grouped_mm", "aten::_scaled_mm",
    "aten::_scaled_dot_product_flash_attention", "aten::_scaled_dot_product_efficient_attention",
    "aten::_scaled_dot_product_cudnn_attention", "aten::_scaled_dot_product_flash_attention_for_cpu",
    "gr00t_model::flash_attention",
})  # fmt: skip
"""Ops whose outputs the selective policy keeps (by qualified name): the GEMMs (Linear layers reach the
dispatcher as mm/addmm, batched matmuls as bmm) and the fused attention kernels (output and log-sum-exp).
Everything else in a block is recomputed: it is memory-bound, cheap next to a GEMM of the same tensors."""


def saves(op: Any) -> bool:
    """Whether the selective policy keeps the outputs of `op` (an aten or custom OpOverload)."""
    packet = getattr(op, "overloadpacket", None)
    return packet is not None and packet._qualified_op_name in SAVED_OPS


def _selective_policy(ctx, op, *args, **kwargs) -> CheckpointPolicy:
    return CheckpointPolicy.MUST_SAVE if saves(op) else CheckpointPolicy.PREFER_RECOMPUTE


selective_contexts = functools.partial(create_selective_checkpoint_contexts, _selective_policy)
"""checkpoint's context_fn for the selective policy (a partial of torch's own, which torch.compile reads)."""


def run_block(block: nn.Module, *args: Any, recompute: bool, policy: str = "full", **kwargs: Any) -> Any:
    """`block(*args, **kwargs)`, with its activations recomputed in the backward under `policy` when
    `recompute` and a backward will need them (gradients on, and the block trains or its input carries a
    gradient). A block compiled with its checkpoint (compile_blocks) does that itself. A block compiled on its
    own (not by compile_blocks) is recomputed whole, its compiled forward run again from the backward: selective
    checkpointing must see the ops, and that backward must not run under a TorchDispatchMode (see above)."""
    if getattr(block, "checkpoints_itself", False):  # compiled with the checkpoint inside (compile_blocks)
        return block(*args, **kwargs)
    if recompute and torch.is_grad_enabled() and _needs_backward(block, args):
        if "forward" in vars(block):  # compiled alone (a frozen block below a trained one): its inputs only
            policy = "full"
        return _checkpoint(block, policy, *args, **kwargs)
    return block(*args, **kwargs)


def checkpointed_forward(block: nn.Module, policy: str) -> types.MethodType:
    """The forward of `block` (not compiled) wrapped in its checkpoint, as a method of `block`, for
    torch.compile to compile whole; blocks it is installed on say so (`checkpoints_itself`)."""
    forward = type(block).forward

    def run(self: nn.Module, *args: Any, **kwargs: Any) -> Any:
        if torch.is_grad_enabled() and _needs_backward(self, args):
            return _checkpoint(functools.partial(forward, self), policy, *args, **kwargs)
        return forward(self, *args, **kwargs)

    return types.MethodType(run, block)


def _checkpoint(fn: Any, policy: str, *args: Any, **kwargs: Any) -> Any:
    if policy == "selective":
        kwargs["context_fn"] = selective_contexts
    elif policy != "full":
        raise ValueError(f"checkpoint policy must be one of {CHECKPOINT_POLICIES}, got {policy!r}")
    return checkpoint(fn, *args, use_reentrant=False, preserve_rng_state=False, **kwargs)


def _needs_backward(block: nn.Module, args: tuple) -> bool:
    if any(isinstance(a, torch.Tensor) and a.requires_grad for a in args):
        return True
    return any(p.requires_grad for p in block.parameters())
