"""Parameter counts per component (model built on the meta device) and analytic training FLOPs per sample.

FLOP method (reference section 4): 2 FLOPs per multiply-add for linear layers and attention; causal LLM
attention counted at half; DiT cross-attention costed over the full VL sequence (SDPA computes it masked);
backward = 2x forward for every part that needs gradients: trainable parts and everything above a trainable
part (with the default fine-tuning policy: the DiT, the encoders/decoder and the top LLM layers only).
"""

from __future__ import annotations

from collections.abc import Mapping

import torch
from torch import nn

from ._config import GR00TConfig

COMPONENTS = (
    "vision",
    "connector",
    "llm",
    "dit",
    "state_encoder",
    "action_encoder",
    "action_decoder",
    "other",
)
_PREFIXES = {
    "backbone.vision_model.": "vision",
    "backbone.mlp1.": "connector",
    "backbone.language_model.": "llm",
    "action_head.model.": "dit",
    "action_head.state_encoder.": "state_encoder",
    "action_head.action_encoder.": "action_encoder",
    "action_head.action_decoder.": "action_decoder",
}


def component_of(name: str) -> str:
    """Which summary component a parameter name belongs to."""
    return next((c for p, c in _PREFIXES.items() if name.startswith(p)), "other")


def count_parameters(model_or_config: nn.Module | GR00TConfig) -> dict[str, int]:
    """Parameters per component plus `total` and `trainable`; a config is built on the meta device (no memory)."""
    if isinstance(model_or_config, GR00TConfig):
        from ._model import GR00TN16

        with torch.device("meta"):
            model = GR00TN16(model_or_config)
    else:
        model = model_or_config
    counts = dict.fromkeys((*COMPONENTS, "total", "trainable"), 0)
    for name, param in model.named_parameters():
        counts[component_of(name)] += param.numel()
        counts["total"] += param.numel()
        counts["trainable"] += param.numel() if param.requires_grad else 0
    return counts


def default_vlm_tokens(config: GR00TConfig, num_images: int, image_size: tuple[int, int]) -> int:
    """VL sequence length of the release's prompt: ~28 text tokens + ~7 per image + the image tokens."""
    unit = config.vision_patch_size * config.downsample_factor
    return 28 + num_images * (7 + (image_size[0] // unit) * (image_size[1] // unit))


def training_flops_per_sample(
    config: GR00TConfig,
    *,
    num_images: int = 1,
    image_size: tuple[int, int] | None = None,
    vlm_tokens: int | None = None,
) -> dict[str, float]:
    """Forward and training FLOPs of one sample, per component; `train` is what MFU uses.

    Returns forward FLOPs per component (`fwd_vision` includes the connector), `fwd_total`, `bwd_total`,
    `train` (= fwd + bwd), `inference` (backbone once + DiT/encoders per Euler step) and `lm_head_avoided`
    (the forward FLOPs of the 151k-way logits the release computes and discards; not in any other number).
    """
    c = config
    h, w = image_size or c.image_size
    unit = c.vision_patch_size * c.downsample_factor
    if h % unit or w % unit:
        raise ValueError(f"image_size {(h, w)} must be multiples of {unit}")
    S = vlm_tokens if vlm_tokens is not None else default_vlm_tokens(c, num_images, (h, w))
    Ta = c.action_horizon
    T = Ta + 1
    vis = num_images * _vision_flops(c, h, w)
    llm_layer = _llm_layer_flops(c, S)
    llm = c.llm_num_layers * llm_layer
    cross, self_, dit_other = _dit_flops(c, T, S)
    n_cross = (c.dit_num_layers + 1) // 2
    dit = n_cross * cross + (c.dit_num_layers - n_cross) * self_ + dit_other
    enc = _encoder_flops(c, Ta, T)
    fwd = {"vision": vis, "llm": llm, "dit": dit, "encoders": enc}
    bwd = 2.0 * (_needs_grad_flops(c, vis, llm_layer, dit, enc))
    fwd_total = sum(fwd.values())
    steps = c.num_inference_timesteps
    cross_kv = n_cross * 2 * 2 * S * c.llm_hidden_size * c.input_embedding_dim
    return {
        **{f"fwd_{k}": v for k, v in fwd.items()},
        "fwd_total": fwd_total,
        "bwd_total": bwd,
        "train": fwd_total + bwd,
        "inference": vis + llm + steps * (dit + enc - cross_kv) + cross_kv,
        "lm_head_avoided": 2.0 * S * c.llm_hidden_size * c.vocab_size,
        "vlm_tokens": float(S),
        "dit_tokens": float(T),
    }


def _vision_flops(c: GR00TConfig, h: int, w: int) -> float:
    n = (h // c.vision_patch_size) * (w // c.vision_patch_size)
    d, f = c.vision_hidden_size, c.vision_intermediate_size
    layer = 2 * n * (4 * d * d + 2 * d * f) + 2 * 2 * n * n * d
    patch = 2 * n * 3 * c.vision_patch_size**2 * d
    merged = d * c.downsample_factor**2
    connector = 2 * (n // c.downsample_factor**2) * (merged * c.llm_hidden_size + c.llm_hidden_size**2)
    return float(c.vision_num_layers * layer + patch + connector)


def _llm_layer_flops(c: GR00TConfig, S: int) -> float:
    d, hd = c.llm_hidden_size, c.llm_head_dim
    q, kv = c.llm_num_heads * hd, c.llm_num_kv_heads * hd
    linear = 2 * S * (d * q + 2 * d * kv + q * d + 3 * d * c.llm_intermediate_size)
    attention = 2 * 2 * S * S * q / 2  # causal: half the score matrix
    return float(linear + attention)


def _dit_flops(c: GR00TConfig, T: int, S: int) -> tuple[float, float, float]:
    d, ctx = c.input_embedding_dim, c.llm_hidden_size
    ff = 2 * T * 2 * d * d * c.dit_ff_mult
    adaln = 2 * d * 2 * d
    cross = 2 * T * 2 * d * d + 2 * S * 2 * ctx * d + 2 * 2 * T * S * d + ff + adaln
    self_ = 2 * T * 4 * d * d + 2 * 2 * T * T * d + ff + adaln
    other = 2 * c.timestep_channels * d + 2 * d * d + 2 * d * 2 * d + 2 * T * d * c.hidden_size
    return float(cross), float(self_), float(other)


def _encoder_flops(c: GR00TConfig, Ta: int, T: int) -> float:
    width, hidden = c.input_embedding_dim, c.hidden_size
    state = 2 * (c.max_state_dim * hidden + hidden * width)
    action = 2 * Ta * (c.max_action_dim * width + 2 * width * width + width * width)
    decoder = 2 * T * (hidden * hidden + hidden * c.max_action_dim)
    return float(state + action + decoder)


def _needs_grad_flops(c: GR00TConfig, vis: float, llm_layer: float, dit: float, enc: float) -> float:
    """Forward FLOPs of the parts whose backward runs (trainable, or above something trainable)."""
    total, below = 0.0, c.tune_visual
    if below:
        total += vis
    below = below or c.tune_llm  # embeddings trainable
    first_tuned = 0 if c.tune_llm else c.llm_num_layers - c.tune_top_llm_layers
    for i in range(c.llm_num_layers):
        below = below or i >= first_tuned
        total += llm_layer if below else 0.0
    head_trains = c.tune_projector or c.tune_diffusion_model or c.tune_vlln
    return total + (dit + enc if head_trains or below else 0.0)


def summary(config: GR00TConfig, **flop_kwargs) -> Mapping[str, Mapping[str, float]]:
    """Parameter counts and FLOPs together (what `python -m gr00t_model summary` prints)."""
    return {"parameters": count_parameters(config), "flops": training_flops_per_sample(config, **flop_kwargs)}
