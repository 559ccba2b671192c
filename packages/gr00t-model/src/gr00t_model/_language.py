"""The Qwen3 text decoder, truncated: token embeddings, the first N decoder layers, final RMSNorm, no LM head.

Our own modules with the parameter names (and creation order) of transformers' Qwen3, so release weights load
as they are and building a model does not import transformers' modeling stack. A layer (`LanguageLayer`)
leaves the block-final residual add to the next layer, where it fuses with the first RMSNorm when blocks are
compiled one at a time (as SigLIP2's layers do). Merging a frozen layer's q/k/v and gate/up projections into
one GEMM each was tried and was slower on an H200 (BENCHMARKS.md, levers tried). The loop, the rotary tables
and the mask are built from tensor ops only (no host reads), so a step can be captured in a CUDA graph. Tests
hold every module to transformers' own.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from ._checkpointing import run_block
from ._config import GR00TConfig


def rotary_tables(
    length: int, head_dim: int, theta: float, device, dtype
) -> tuple[torch.Tensor, torch.Tensor]:
    """cos/sin [1, length, head_dim] of standard (half-split) RoPE at positions 0..length-1."""
    inv_freq = 1.0 / theta ** (torch.arange(0, head_dim, 2, device=device, dtype=torch.float32) / head_dim)
    freqs = torch.arange(length, device=device, dtype=torch.float32)[:, None] * inv_freq[None, :]
    angles = torch.cat((freqs, freqs), dim=-1)[None]
    return angles.cos().to(dtype), angles.sin().to(dtype)


def causal_padding_mask(valid: torch.Tensor) -> torch.Tensor:
    """[B, S] valid tokens -> [B, 1, S, S] boolean SDPA mask (True = attend): causal, padding keys hidden.

    Every query also sees itself, so a padding row never has nothing to attend to (SDPA would give NaN).
    """
    length = valid.shape[-1]
    causal = torch.ones(length, length, dtype=torch.bool, device=valid.device).tril()
    eye = torch.eye(length, dtype=torch.bool, device=valid.device)
    return (causal[None] & valid[:, None, :]).logical_or(eye[None])[:, None]


class LanguageModel(nn.Module):
    """`embed_tokens`, `layers`, `norm`: the parameter names of transformers' `Qwen3Model`."""

    def __init__(self, config: GR00TConfig) -> None:
        super().__init__()
        self.head_dim = config.llm_head_dim
        self.rope_theta = config.llm_rope_theta
        self.embed_tokens = nn.Embedding(config.vocab_size, config.llm_hidden_size)
        self.layers = nn.ModuleList(LanguageLayer(config) for _ in range(config.llm_num_layers))
        self.norm = RMSNorm(config.llm_hidden_size, eps=config.llm_rms_norm_eps)
        self.recompute = "llm" in config.checkpoint_blocks  # activation checkpointing (_checkpointing)
        self.recompute_policy = config.checkpoint_policy

    def forward(self, inputs_embeds: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
        """[B, S, D] embeddings + [B, S] bool valid -> final-normed hidden states [B, S, D]."""
        return self.norm(self.run_layers(inputs_embeds, valid, 0, len(self.layers)))

    def run_layers(self, hidden: torch.Tensor, valid: torch.Tensor, start: int, stop: int) -> torch.Tensor:
        """Layers [start, stop) on hidden states [B, S, D] (no final norm): a forward can stop after the frozen
        layers and resume from there.

        Positions are 0..S-1 for every row: RoPE scores depend only on position differences, so real tokens
        get the same result whatever padding surrounds them.
        """
        if start >= stop:
            return hidden
        cos, sin, mask = self.tables(hidden, valid)
        pending = None
        recompute = {"recompute": self.recompute, "policy": self.recompute_policy}  # (_checkpointing)
        for layer in self.layers[start:stop]:
            hidden, pending = run_block(layer, hidden, pending, mask, (cos, sin), **recompute)
        return hidden + pending

    def tables(
        self, hidden: torch.Tensor, valid: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(cos, sin, mask) for a run over `hidden` [B, S, D]: RoPE tables in the embeddings' dtype (wherever
        the run starts) and the causal padding mask. About 20 small kernels eagerly, twice per training step
        (the frozen prefix and the trainable layers)."""
        dtype = self.embed_tokens.weight.dtype
        cos, sin = rotary_tables(hidden.shape[1], self.head_dim, self.rope_theta, hidden.device, dtype)
        return cos, sin, causal_padding_mask(valid)


class RMSNorm(nn.Module):
    """Qwen3's RMSNorm: the statistics in fp32, the result cast back to the input's dtype before the weight."""

    def __init__(self, size: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(size))
        self.variance_epsilon = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = x.to(torch.float32)
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.variance_epsilon)
        return self.weight * h.to(x.dtype)

    def extra_repr(self) -> str:
        return f"{self.weight.shape[0]}, eps={self.variance_epsilon}"


class LanguageAttention(nn.Module):
    """Qwen3's attention parameters: q/k/v/o projections without bias, q/k RMSNorm per head (`attention`)."""

    def __init__(self, config: GR00TConfig) -> None:
        super().__init__()
        width, dim = config.llm_hidden_size, config.llm_head_dim
        heads, kv_heads = config.llm_num_heads, config.llm_num_kv_heads
        self.head_dim, self.num_key_value_groups, self.scaling = dim, heads // kv_heads, dim**-0.5
        self.q_proj = nn.Linear(width, heads * dim, bias=False)
        self.k_proj = nn.Linear(width, kv_heads * dim, bias=False)
        self.v_proj = nn.Linear(width, kv_heads * dim, bias=False)
        self.o_proj = nn.Linear(heads * dim, width, bias=False)
        self.q_norm = RMSNorm(dim, eps=config.llm_rms_norm_eps)
        self.k_norm = RMSNorm(dim, eps=config.llm_rms_norm_eps)


class LanguageMLP(nn.Module):
    """Qwen3's gated MLP parameters (`mlp`)."""

    def __init__(self, config: GR00TConfig) -> None:
        super().__init__()
        width, hidden = config.llm_hidden_size, config.llm_intermediate_size
        self.gate_proj = nn.Linear(width, hidden, bias=False)
        self.up_proj = nn.Linear(width, hidden, bias=False)
        self.down_proj = nn.Linear(hidden, width, bias=False)
        self.act_fn = nn.SiLU()


class LanguageLayer(nn.Module):
    """A Qwen3 decoder layer (pre-norm attention, then pre-norm MLP) whose forward leaves its MLP's residual
    add to the next layer."""

    def __init__(self, config: GR00TConfig) -> None:
        super().__init__()
        self.hidden_size = config.llm_hidden_size
        self.self_attn = LanguageAttention(config)
        self.mlp = LanguageMLP(config)
        self.input_layernorm = RMSNorm(config.llm_hidden_size, eps=config.llm_rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(config.llm_hidden_size, eps=config.llm_rms_norm_eps)

    def forward(self, hidden, pending=None, attention_mask=None, position_embeddings=None):
        """(residual stream, the previous layer's MLP output or None, [B, 1, S, S] bool mask, (cos, sin))
        -> (the stream after this layer's attention, this layer's MLP output): the stream after the layer
        is their sum, the same adds in the same order as transformers' layer."""
        if pending is not None:
            hidden = hidden + pending
        normed = self.input_layernorm(hidden)
        hidden = hidden + attention(self.self_attn, normed, attention_mask, *position_embeddings)
        return hidden, mlp(self.mlp, self.post_attention_layernorm(hidden))


def attention(attn: nn.Module, x: torch.Tensor, mask: torch.Tensor | None, cos, sin) -> torch.Tensor:
    """Qwen3's attention as transformers computes it with SDPA (no cache, no dropout): q/k RMSNorm per head, half-split RoPE,
    k and v repeated to every query head (as transformers does under a mask), then the output projection."""
    shape = (*x.shape[:-1], -1, attn.head_dim)
    q = _rotate(attn.q_norm(attn.q_proj(x).view(shape)).transpose(1, 2), cos, sin)
    k = _rotate(attn.k_norm(attn.k_proj(x).view(shape)).transpose(1, 2), cos, sin)
    v = attn.v_proj(x).view(shape).transpose(1, 2)
    k, v = _repeat_heads(k, attn.num_key_value_groups), _repeat_heads(v, attn.num_key_value_groups)
    out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=attn.scaling)
    return attn.o_proj(out.transpose(1, 2).reshape(*x.shape[:-1], -1))


def mlp(module: nn.Module, x: torch.Tensor) -> torch.Tensor:
    """Qwen3's MLP: down(silu(gate(x)) * up(x))."""
    return module.down_proj(module.act_fn(module.gate_proj(x)) * module.up_proj(x))


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Half-split RoPE on [B, H, S, D] with cos/sin [B or 1, S, D]."""
    half = x.shape[-1] // 2
    rotated = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
    return x * cos[:, None] + rotated * sin[:, None]


def _repeat_heads(x: torch.Tensor, groups: int) -> torch.Tensor:
    """[B, KV, S, D] -> [B, KV * groups, S, D], each kv head repeated for its group of query heads."""
    if groups == 1:
        return x
    b, heads, s, d = x.shape
    return x[:, :, None].expand(b, heads, groups, s, d).reshape(b, heads * groups, s, d)


def init_language_(model: LanguageModel) -> None:
    """Qwen3's initialisation: N(0, 0.02) for linear weights and token embeddings; RMSNorm weights 1."""
    for module in model.modules():
        if isinstance(module, (nn.Linear, nn.Embedding)):
            nn.init.normal_(module.weight, std=0.02)
