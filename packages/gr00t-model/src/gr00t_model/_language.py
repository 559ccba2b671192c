"""The Qwen3 text decoder, truncated: token embeddings, the first N decoder layers, final RMSNorm, no LM head.

Layers are transformers' `Qwen3DecoderLayer` with our forward (`language_layer_class`, the same parameters and
the same ops): it leaves the block-final residual add to the next layer, where it fuses with the first RMSNorm
when blocks are compiled one at a time (as SigLIP2's layers do). Merging a frozen layer's q/k/v and gate/up
projections into one GEMM each was tried and was slower on an H200 (BENCHMARKS.md, levers tried). The loop,
the rotary tables and the mask are ours, built from tensor ops only (no host reads), so a step can be captured
in a CUDA graph.
"""

from __future__ import annotations

import functools

import torch
import torch.nn.functional as F
from torch import nn

from ._checkpointing import run_block
from ._config import GR00TConfig


def qwen3_config(config: GR00TConfig):
    """The transformers `Qwen3Config` matching our sizes, with only the kept layers."""
    from transformers import Qwen3Config

    kwargs = dict(
        vocab_size=config.vocab_size,
        hidden_size=config.llm_hidden_size,
        intermediate_size=config.llm_intermediate_size,
        num_hidden_layers=config.llm_num_layers,
        num_attention_heads=config.llm_num_heads,
        num_key_value_heads=config.llm_num_kv_heads,
        head_dim=config.llm_head_dim,
        hidden_act="silu",
        max_position_embeddings=40960,
        rms_norm_eps=config.llm_rms_norm_eps,
        attention_bias=False,
        attention_dropout=0.0,
        use_sliding_window=False,
        tie_word_embeddings=True,
    )
    try:
        hf = Qwen3Config(
            **kwargs, rope_parameters={"rope_type": "default", "rope_theta": config.llm_rope_theta}
        )
    except TypeError:  # releases that still take rope_theta directly
        hf = Qwen3Config(**kwargs, rope_theta=config.llm_rope_theta)
    hf._attn_implementation = "sdpa"
    return hf


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
        from transformers.models.qwen3.modeling_qwen3 import Qwen3RMSNorm

        hf = qwen3_config(config)
        self.head_dim = config.llm_head_dim
        self.rope_theta = config.llm_rope_theta
        self.embed_tokens = nn.Embedding(config.vocab_size, config.llm_hidden_size)
        self.layers = nn.ModuleList(language_layer_class()(hf, i) for i in range(config.llm_num_layers))
        self.norm = Qwen3RMSNorm(config.llm_hidden_size, eps=config.llm_rms_norm_eps)
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


@functools.cache
def language_layer_class() -> type[nn.Module]:
    """`Qwen3DecoderLayer` with our forward (transformers is imported on first use, as everywhere in this
    package): the same parameters, names and ops, in SDPA's form."""
    from transformers.models.qwen3.modeling_qwen3 import Qwen3DecoderLayer

    class LanguageLayer(Qwen3DecoderLayer):
        def forward(self, hidden, pending=None, attention_mask=None, position_embeddings=None):
            """(residual stream, the previous layer's MLP output or None, [B, 1, S, S] bool mask, (cos, sin))
            -> (the stream after this layer's attention, this layer's MLP output): the stream after the layer
            is their sum, the same adds in the same order as transformers' layer."""
            if pending is not None:
                hidden = hidden + pending
            normed = self.input_layernorm(hidden)
            hidden = hidden + attention(self.self_attn, normed, attention_mask, *position_embeddings)
            return hidden, mlp(self.mlp, self.post_attention_layernorm(hidden))

    # Found again by name (module __getattr__ below), so whole models still pickle.
    LanguageLayer.__module__, LanguageLayer.__qualname__ = __name__, "LanguageLayer"
    return LanguageLayer


def attention(attn: nn.Module, x: torch.Tensor, mask: torch.Tensor | None, cos, sin) -> torch.Tensor:
    """transformers' Qwen3Attention with SDPA (no cache, no dropout): q/k RMSNorm per head, half-split RoPE,
    k and v repeated to every query head (as transformers does under a mask), then the output projection."""
    shape = (*x.shape[:-1], -1, attn.head_dim)
    q = _rotate(attn.q_norm(attn.q_proj(x).view(shape)).transpose(1, 2), cos, sin)
    k = _rotate(attn.k_norm(attn.k_proj(x).view(shape)).transpose(1, 2), cos, sin)
    v = attn.v_proj(x).view(shape).transpose(1, 2)
    k, v = _repeat_heads(k, attn.num_key_value_groups), _repeat_heads(v, attn.num_key_value_groups)
    out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=attn.scaling)
    return attn.o_proj(out.transpose(1, 2).reshape(*x.shape[:-1], -1))


def mlp(module: nn.Module, x: torch.Tensor) -> torch.Tensor:
    """transformers' Qwen3MLP."""
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


def __getattr__(name: str):
    if name == "LanguageLayer":
        return language_layer_class()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def init_language_(model: LanguageModel) -> None:
    """Qwen3's initialisation: N(0, 0.02) for linear weights and token embeddings; RMSNorm weights 1."""
    for module in model.modules():
        if isinstance(module, (nn.Linear, nn.Embedding)):
            nn.init.normal_(module.weight, std=0.02)
