"""The alternating vision-language DiT of the action head (parameter names follow the release's diffusers layout).

Block i: AdaLN(norm1) -> attention -> dropout -> residual; LayerNorm(norm3) -> feed-forward -> residual.
Odd blocks self-attend over the state/action tokens; even blocks cross-attend to the VL features, to the
non-image tokens when i % (2 * attend_text_every_n_blocks) == 0 and to the image tokens otherwise.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from . import _context_cast as context_cast
from ._attention import attention, load_triton
from ._checkpointing import run_block
from ._config import GR00TConfig
from ._keep_mask import draw_keep_mask
from ._merged_linear import merge_linears

# The self-attention blocks (51 tokens, head dim 48, no mask) run fastest on SDPA's memory-efficient kernel on
# an H200: 0.031 ms forward + backward per block against 0.042 for cuDNN, SDPA's own pick there
# (benchmarks/probes/attention_probe.py), and without the memset cuDNN puts before each call. The cross-attention
# (a key mask) keeps SDPA's pick, cuDNN, which is fastest for it. The kernel is called by its aten name, not
# chosen with an `sdpa_kernel` context: inside a compiled block that context made AOTAutograd's cache bypass
# the block's graph, which every start-up then traced again (tests/gr00t_model/test_compile_cache_gpu.py).
SELF_ATTENTION_EFFICIENT = True
EFFICIENT_DTYPES = (torch.float16, torch.bfloat16, torch.float32)


def self_attention(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor) -> torch.Tensor:
    """Unmasked attention of [B, heads, S, head_dim] CUDA tensors on SDPA's memory-efficient kernel where it
    takes them (head_dim a multiple of 8, half or single precision), else on SDPA's own pick."""
    if SELF_ATTENTION_EFFICIENT and query.dtype in EFFICIENT_DTYPES and query.size(-1) % 8 == 0:
        grad = torch.is_grad_enabled() and any(t.requires_grad for t in (query, key, value))
        # the log-sum-exp is kept for the backward only, as SDPA does
        return torch.ops.aten._scaled_dot_product_efficient_attention(query, key, value, None, grad)[0]
    return F.scaled_dot_product_attention(query, key, value)


class Dropout(nn.Dropout):
    """nn.Dropout that can apply a keep-mask drawn elsewhere. In training, AlternateVLDiT draws every block's
    masks in one kernel (`_keep_mask`): compiled blocks otherwise draw one Philox number per element inside
    their fused kernels, which took about 5x their bytes' time (1.6 ms per step at n1.6-3b on an H200)."""

    def forward(self, x: torch.Tensor, keep: torch.Tensor | None = None) -> torch.Tensor:
        if keep is None or not self.training:
            return super().forward(x)
        return x * keep.view(x.shape) * (1.0 / (1.0 - self.p))


def timestep_sinusoid(buckets: torch.Tensor, channels: int) -> torch.Tensor:
    """[B] integer buckets -> [B, channels]: cos half then sin half, frequencies exp(-ln(1e4) i / (half - 1))."""
    half = channels // 2
    exponent = (
        -math.log(10000.0) * torch.arange(half, device=buckets.device, dtype=torch.float32) / (half - 1)
    )
    angles = buckets.float()[:, None] * exponent.exp()[None, :]
    return torch.cat((angles.cos(), angles.sin()), dim=-1)


class TimestepEmbedding(nn.Module):
    """linear_1 -> SiLU -> linear_2."""

    def __init__(self, channels: int, dim: int) -> None:
        super().__init__()
        self.linear_1 = nn.Linear(channels, dim)
        self.linear_2 = nn.Linear(dim, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.linear_2(F.silu(self.linear_1(x)))


class TimestepEncoder(nn.Module):
    """Sinusoid of the time bucket -> MLP -> `temb` [B, dim]."""

    def __init__(self, channels: int, dim: int) -> None:
        super().__init__()
        self.channels = channels
        self.timestep_embedder = TimestepEmbedding(channels, dim)

    def forward(self, buckets: torch.Tensor) -> torch.Tensor:
        weight = self.timestep_embedder.linear_1.weight
        return self.timestep_embedder(timestep_sinusoid(buckets, self.channels).to(weight.dtype))


class AdaLayerNorm(nn.Module):
    """LayerNorm without affine, then x * (1 + scale) + shift with (scale, shift) = Linear(SiLU(temb)). Where
    the DiT merged every block's `linear` into one (merged_dit_linears), it passes the modulation in."""

    def __init__(self, dim: int, eps: float = 1e-5) -> None:
        super().__init__()
        self.linear = nn.Linear(dim, 2 * dim)
        self.norm = nn.LayerNorm(dim, eps=eps, elementwise_affine=False)

    def forward(self, x: torch.Tensor, temb: torch.Tensor | None, modulation=None) -> torch.Tensor:
        if modulation is None:
            modulation = self.linear(F.silu(temb))
        scale, shift = modulation.chunk(2, dim=1)
        return self.norm(x) * (1 + scale[:, None]) + shift[:, None]


class Attention(nn.Module):
    """Multi-head attention; keys/values from `context` (cross) or from the input (self). Through SDPA, or on
    CUDA with `triton` (GR00TConfig.triton_attention) through our kernels (`_attention`). With `merged`, a
    self-attention block computes q, k and v in one GEMM (`to_qkv`; state dicts keep to_q, to_k, to_v)."""

    def __init__(
        self,
        dim: int,
        heads: int,
        head_dim: int,
        dropout: float,
        context_dim: int | None,
        merged: bool = False,
    ) -> None:
        super().__init__()
        self.heads, self.head_dim, self.triton = heads, head_dim, False
        inner, source = heads * head_dim, context_dim or dim
        self.to_q = nn.Linear(dim, inner)
        self.to_k = nn.Linear(source, inner)
        self.to_v = nn.Linear(source, inner)
        if merged and context_dim is None:
            merge_linears(self, "to_qkv", ["to_q", "to_k", "to_v"])
        self.to_out = nn.ModuleList([nn.Linear(inner, dim), Dropout(dropout)])

    def split(self, x: torch.Tensor) -> torch.Tensor:
        return x.unflatten(-1, (self.heads, self.head_dim)).transpose(1, 2)

    def key_values(
        self, source: torch.Tensor | tuple[torch.Tensor, torch.Tensor]
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Projected keys and values [B, heads, S, head_dim] (reusable across denoising steps). `source` may
        be a (k input, v input) pair (`_context_cast`)."""
        k_source, v_source = source if isinstance(source, tuple) else (source, source)
        return self.split(self.to_k(k_source)), self.split(self.to_v(v_source))

    def forward(self, x, context=None, mask=None, kv=None, keep=None) -> torch.Tensor:
        if hasattr(self, "to_qkv"):
            query, key, value = (self.split(y) for y in self.to_qkv.forward_parts(x))
        else:
            key, value = kv if kv is not None else self.key_values(x if context is None else context)
            query = self.split(self.to_q(x))
        if self.triton and x.is_cuda:
            out = attention(query, key, value, key_mask=mask, triton=True)
        elif mask is None and x.is_cuda:
            out = self_attention(query, key, value)
        else:
            attn_mask = None if mask is None else mask[:, None, None, :]
            out = F.scaled_dot_product_attention(query, key, value, attn_mask=attn_mask)
        out = self.to_out[0](out.transpose(1, 2).flatten(2))
        return self.to_out[1](out, keep)


class GELUProjection(nn.Module):
    """`proj` Linear followed by tanh-approximated GELU."""

    def __init__(self, dim: int, inner: int) -> None:
        super().__init__()
        self.proj = nn.Linear(dim, inner)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.gelu(self.proj(x), approximate="tanh")


class FeedForward(nn.Module):
    """net: [GELU projection, Dropout, Linear, Dropout]."""

    def __init__(self, dim: int, mult: int, dropout: float) -> None:
        super().__init__()
        inner = dim * mult
        self.net = nn.ModuleList(
            [GELUProjection(dim, inner), Dropout(dropout), nn.Linear(inner, dim), Dropout(dropout)]
        )

    def forward(self, x: torch.Tensor, keeps: tuple = (None, None)) -> torch.Tensor:
        up, drop_inner, down, drop_out = self.net
        return drop_out(down(drop_inner(up(x), keeps[0])), keeps[1])


class TransformerBlock(nn.Module):
    """Pre-norm block; only norm1 is time-modulated; attention output gets a second dropout (final_dropout)."""

    def __init__(self, config: GR00TConfig, context_dim: int | None) -> None:
        super().__init__()
        dim, p, merged = config.input_embedding_dim, config.dit_dropout, config.merged_dit_linears
        self.norm1 = AdaLayerNorm(dim)
        self.attn1 = Attention(dim, config.dit_num_heads, config.dit_head_dim, p, context_dim, merged)
        self.final_dropout = Dropout(p)
        self.norm3 = nn.LayerNorm(dim, eps=1e-5, elementwise_affine=False)
        self.ff = FeedForward(dim, config.dit_ff_mult, p)

    def forward(self, x, temb, context=None, mask=None, kv=None, keep=None, modulation=None) -> torch.Tensor:
        """keep: this block's keep-masks, flat [(3 + ff_mult) * x.numel()] bool (`AlternateVLDiT.keep_masks`):
        the attention output's, final_dropout's, the feed-forward's inner and output ones, in that order.
        modulation: norm1's (scale | shift) [B, 2 * dim] where the DiT computes them for every block at once."""
        n = x.numel()
        keeps = [None] * 4 if keep is None else keep.split([n, n, keep.numel() - 3 * n, n])
        normed = self.norm1(x, temb, modulation)
        x = x + self.final_dropout(self.attn1(normed, context, mask, kv, keeps[0]), keeps[1])
        return x + self.ff(self.norm3(x), keeps[2:])


class AlternateVLDiT(nn.Module):
    """32 blocks alternating cross-attention (text / image tokens) and self-attention, AdaLN on the time bucket."""

    def __init__(self, config: GR00TConfig) -> None:
        super().__init__()
        dim = config.input_embedding_dim
        self.text_period = 2 * config.attend_text_every_n_blocks
        self.dropout, self.ff_mult = config.dit_dropout, config.dit_ff_mult
        self.timestep_encoder = TimestepEncoder(config.timestep_channels, dim)
        self.transformer_blocks = nn.ModuleList(
            TransformerBlock(config, None if i % 2 else config.llm_hidden_size)
            for i in range(config.dit_num_layers)
        )
        for block in self.transformer_blocks:
            block.attn1.triton = config.triton_attention
        if config.triton_attention:
            load_triton()  # here, not inside the compiled blocks
        self.grad_sum = None  # the context cast's gradient sum; compile_blocks compiles one (_context_cast)
        self.recompute = "dit" in config.checkpoint_blocks  # activation checkpointing (_checkpointing)
        self.recompute_policy = config.checkpoint_policy
        self.norm_out = nn.LayerNorm(dim, eps=1e-6, elementwise_affine=False)
        self.proj_out_1 = nn.Linear(dim, 2 * dim)
        self.proj_out_2 = nn.Linear(dim, config.hidden_size)
        if config.merged_dit_linears:  # all read silu(temb): one GEMM for every block's AdaLN and proj_out_1
            blocks = [f"transformer_blocks.{i}.norm1.linear" for i in range(config.dit_num_layers)]
            merge_linears(self, "modulations", [*blocks, "proj_out_1"])

    def keep_masks(self, tokens: torch.Tensor) -> torch.Tensor | None:
        """Every block's dropout keep-masks from one Bernoulli draw, [blocks, (3 + ff_mult) * tokens.numel()]
        bool (each row is one block's `keep`); None when no dropout applies (eval, p = 0 or 1)."""
        if not (self.training and 0.0 < self.dropout < 1.0):
            return None
        size = (len(self.transformer_blocks), (3 + self.ff_mult) * tokens.numel())
        return draw_keep_mask(size, self.dropout, tokens.device)

    def cross_key_values(self, context: torch.Tensor) -> list:
        """Per-block keys/values of the VL context (None for self-attention blocks), for multi-step inference."""
        return [None if i % 2 else b.attn1.key_values(context) for i, b in enumerate(self.transformer_blocks)]

    def forward(
        self,
        tokens: torch.Tensor,
        context: torch.Tensor,
        buckets: torch.Tensor,
        text_mask: torch.Tensor,
        image_mask: torch.Tensor,
        kv_cache: list | None = None,
    ) -> torch.Tensor:
        """tokens [B, T, dim], context [B, S, Dc], buckets [B] int, masks [B, S] bool -> [B, T, hidden_size]."""
        temb = self.timestep_encoder(buckets)
        if hasattr(self, "modulations"):
            *modulations, out_modulation = self.modulations.forward_parts(F.silu(temb))
        else:
            modulations, out_modulation = [None] * len(self.transformer_blocks), None
        text_mask, image_mask = _never_empty(text_mask), _never_empty(image_mask)
        keeps = self.keep_masks(tokens)
        sources = None
        if kv_cache is None and context_cast.applies(context):
            sources = context_cast.cast_for_blocks(
                context, (len(self.transformer_blocks) + 1) // 2, self.grad_sum
            )
        recompute = {"recompute": self.recompute, "policy": self.recompute_policy}  # (_checkpointing)
        for i, block in enumerate(self.transformer_blocks):
            keep = None if keeps is None else keeps[i]
            if i % 2:
                tokens = run_block(block, tokens, temb, keep=keep, modulation=modulations[i], **recompute)
            else:
                mask = text_mask if i % self.text_period == 0 else image_mask
                kv = kv_cache[i] if kv_cache is not None else None
                source = context if sources is None else sources[i // 2]
                tokens = run_block(block, tokens, temb, source, mask, kv, keep, modulations[i], **recompute)
        if out_modulation is None:
            out_modulation = self.proj_out_1(F.silu(temb))
        shift, scale = out_modulation.chunk(2, dim=1)
        return self.proj_out_2(self.norm_out(tokens) * (1 + scale[:, None]) + shift[:, None])


def _never_empty(mask: torch.Tensor) -> torch.Tensor:
    """A row with nothing to attend to attends to everything instead of producing NaN (only padding rows)."""
    return mask | ~mask.any(dim=-1, keepdim=True)
