"""Attention over the model's short sequences, in SDPA's layout: our Triton flash kernels on CUDA
(GR00TConfig.triton_attention), SDPA elsewhere and as the reference.

Why our own kernels: every attention of n1.6-3b is short (SigLIP2 324 keys with head dim 72, Qwen3 204 causal,
the DiT 51 queries over 51 or 204 keys with head dim 48), where SDPA's kernels run far below the GPU's rate
(BENCHMARKS.md, levers tried). Ours split a head dim that is not a power of two into two tiles
instead of padding it, read q/k/v in the projections' own [B, S, H, D] layout (no transposes) and index a
shared key/value head directly (no repeated copies).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    key_mask: torch.Tensor | None = None,
    causal: bool = False,
    scale: float | None = None,
    triton: bool = False,
) -> torch.Tensor:
    """q [B, H, Lq, D], k/v [B, Hkv, Lk, D] (Hkv divides H), key_mask [B, Lk] bool (True = attend) -> [B, H, Lq, D].

    causal: query i sees keys j <= i that the key mask allows, and always itself (so a padding row is never
    empty). `triton` asks for the Triton kernels; they run where the tensors are on CUDA, Triton imports and
    the shapes fit (`_attention_op.supported`), SDPA otherwise.
    """
    scale = q.shape[-1] ** -0.5 if scale is None else scale
    op = (_OP or _load()) if triton and q.is_cuda else None
    if op is not None and op.supported(q, k):
        mask = None if key_mask is None else key_mask.to(torch.bool)
        out, _ = op.flash_attention(
            q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), mask, causal, scale
        )
        return out.transpose(1, 2)
    return sdpa_attention(q, k, v, key_mask, causal, scale)


def sdpa_attention(q, k, v, key_mask=None, causal: bool = False, scale: float | None = None) -> torch.Tensor:
    """The same contract through F.scaled_dot_product_attention (k and v repeated to the query heads)."""
    groups = q.shape[1] // k.shape[1]
    if groups > 1:
        k, v = k.repeat_interleave(groups, dim=1), v.repeat_interleave(groups, dim=1)
    mask = None if key_mask is None else key_mask.to(torch.bool)[:, None, None, :]
    if causal:
        lq, lk = q.shape[-2], k.shape[-2]
        tril = torch.ones(lq, lk, dtype=torch.bool, device=q.device).tril()
        eye = torch.eye(lq, lk, dtype=torch.bool, device=q.device)
        mask = (tril if mask is None else tril & mask) | eye
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=scale)


_OP = None  # the custom op's module, once load_triton() found it


def load_triton() -> bool:
    """Import the Triton kernels' op (once); False where Triton is missing. Models that ask for the kernels
    call this when they are built, so that compiled code calling attention() only reads a module global
    (torch.compile would otherwise trace the import, and warns about a cached lookup)."""
    return _load() is not None


def _load():
    global _OP
    if _OP is None:
        try:
            from . import _attention_op
        except ImportError:
            return None
        _OP = _attention_op
    return _OP
