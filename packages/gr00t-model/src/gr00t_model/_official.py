"""The release's checkpoint layout: parameter names and `config.json` fields, mapped to ours and back."""

from __future__ import annotations

import re
from typing import Any

from ._config import GR00TConfig

# (our prefix, official prefix); the first match wins.
_PREFIX_MAP = (
    ("backbone.vision_model.", "backbone.model.vision_model.vision_model."),
    ("backbone.mlp1.", "backbone.model.mlp1."),
    ("backbone.language_model.", "backbone.model.language_model.model."),
    ("action_head.", "action_head."),
)
# Official tensors we never build: the tied LM head (its logits are never used), the vision pooling head
# (never called), and LLM layers beyond the kept ones.
_IGNORED = (
    re.compile(r"^backbone\.model\.language_model\.lm_head\."),
    re.compile(r"^backbone\.model\.vision_model\.vision_model\.head\."),
)
_LLM_LAYER = re.compile(r"^backbone\.model\.language_model\.model\.layers\.(\d+)\.")

# Release config fields copied onto ours (official name -> our field).
_FIELDS = {
    "action_horizon": "action_horizon",
    "max_state_dim": "max_state_dim",
    "max_action_dim": "max_action_dim",
    "hidden_size": "hidden_size",
    "input_embedding_dim": "input_embedding_dim",
    "max_num_embodiments": "max_num_embodiments",
    "max_seq_len": "max_seq_len",
    "attend_text_every_n_blocks": "attend_text_every_n_blocks",
    "tune_top_llm_layers": "tune_top_llm_layers",
    "tune_llm": "tune_llm",
    "tune_visual": "tune_visual",
    "tune_projector": "tune_projector",
    "tune_diffusion_model": "tune_diffusion_model",
    "tune_vlln": "tune_vlln",
    "noise_beta_alpha": "noise_beta_alpha",
    "noise_beta_beta": "noise_beta_beta",
    "noise_s": "noise_s",
    "num_timestep_buckets": "num_timestep_buckets",
    "num_inference_timesteps": "num_inference_timesteps",
    "state_dropout_prob": "state_dropout_prob",
}
_DIT_FIELDS = {
    "num_layers": "dit_num_layers",
    "num_attention_heads": "dit_num_heads",
    "attention_head_dim": "dit_head_dim",
    "dropout": "dit_dropout",
}
# Release variants this model does not implement, with the value it needs.
_REQUIRED = {"use_vlln": True, "add_pos_embed": True, "use_alternate_vl_dit": True}
# Action-head sizes the release hard-codes in its modules (never in config.json): the DiT's sinusoidal
# timestep width and its feed-forward expansion. A base preset's values must not leak in (tiny uses 32).
RELEASE_FIXED = {"timestep_channels": 256, "dit_ff_mult": 4}


def is_official_config(data: dict[str, Any]) -> bool:
    """Whether a config.json was written by the release (model_type Gr00tN1d6)."""
    return data.get("model_type") == "Gr00tN1d6"


def config_from_official(data: dict[str, Any], base: GR00TConfig | None = None) -> GR00TConfig:
    """Our config from a release config.json; backbone sizes come from `base` (default: the n1.6-3b preset).

    The release's config.json holds the action-head fields only (reference section 11); what the release
    fixes in code (`RELEASE_FIXED`) is pinned, whatever `base` says.
    """
    base = base or GR00TConfig.preset("n1.6-3b")
    for key, needed in _REQUIRED.items():
        if data.get(key, needed) != needed:
            raise ValueError(
                f"config.json: {key}={data[key]!r} is not supported (this model implements {key}={needed})"
            )
    changes = {ours: data[theirs] for theirs, ours in _FIELDS.items() if theirs in data}
    changes.update(RELEASE_FIXED)
    dit = data.get("diffusion_model_cfg") or {}
    changes.update({ours: dit[theirs] for theirs, ours in _DIT_FIELDS.items() if theirs in dit})
    if "output_dim" in dit and dit["output_dim"] != changes.get("hidden_size", base.hidden_size):
        raise ValueError(
            f"config.json: diffusion_model_cfg.output_dim={dit['output_dim']} must equal hidden_size"
        )
    if data.get("backbone_embedding_dim", base.llm_hidden_size) != base.llm_hidden_size:
        raise ValueError(
            f"config.json: backbone_embedding_dim={data['backbone_embedding_dim']} differs from the backbone's "
            f"hidden size {base.llm_hidden_size}; pass a matching `config`"
        )
    if int(data.get("select_layer", -1)) > 0:
        changes["llm_num_layers"] = int(data["select_layer"])
        changes["tune_top_llm_layers"] = min(
            changes.get("tune_top_llm_layers", base.tune_top_llm_layers), changes["llm_num_layers"]
        )
    return base.replace(**changes)


def config_to_official(config: GR00TConfig) -> dict[str, Any]:
    """A release-style config.json for our config (action-head fields, as the release writes them).

    Raises for a config the release layout cannot describe (a `RELEASE_FIXED` size that differs).
    """
    differs = {k: getattr(config, k) for k, v in RELEASE_FIXED.items() if getattr(config, k) != v}
    if differs:
        raise ValueError(
            f"the release layout cannot record {differs}: the release fixes {RELEASE_FIXED} in code; "
            "save this model with the default layout"
        )
    data: dict[str, Any] = {
        "model_type": "Gr00tN1d6",
        "model_name": "nvidia/Eagle-Block2A-2B-v2",
        **_REQUIRED,
    }
    data.update({theirs: getattr(config, ours) for theirs, ours in _FIELDS.items()})
    data["backbone_embedding_dim"] = config.llm_hidden_size
    data["select_layer"] = config.llm_num_layers
    data["diffusion_model_cfg"] = {
        **{theirs: getattr(config, ours) for theirs, ours in _DIT_FIELDS.items()},
        "norm_type": "ada_norm",
        "final_dropout": True,
        "output_dim": config.hidden_size,
        "interleave_self_attention": True,
        "positional_embeddings": None,
    }
    return data


def to_official_name(name: str) -> str:
    """Our parameter name -> the release's."""
    for ours, theirs in _PREFIX_MAP:
        if name.startswith(ours):
            return theirs + name[len(ours) :]
    raise KeyError(f"parameter {name!r} has no official name")


def from_official_name(name: str, kept_llm_layers: int) -> str | None:
    """The release's parameter name -> ours, or None for tensors this model never builds (see _IGNORED)."""
    if any(p.match(name) for p in _IGNORED):
        return None
    layer = _LLM_LAYER.match(name)
    if layer and int(layer.group(1)) >= kept_llm_layers:
        return None
    for ours, theirs in _PREFIX_MAP:
        if name.startswith(theirs):
            return ours + name[len(theirs) :]
    return name  # unknown: reported as unexpected under its own name
