"""transformers' own SigLIP2 and Qwen3 configs at a GR00TConfig's sizes: the plain references that
gr00t_model's vision and language modules are held to (the model itself never imports transformers' modeling
code)."""

from __future__ import annotations


def siglip2_config(config):
    """The transformers `Siglip2VisionConfig` matching our sizes (SDPA attention, no pooling head)."""
    from transformers import Siglip2VisionConfig

    hf = Siglip2VisionConfig(
        hidden_size=config.vision_hidden_size,
        intermediate_size=config.vision_intermediate_size,
        num_hidden_layers=config.vision_num_layers,
        num_attention_heads=config.vision_num_heads,
        num_channels=3,
        patch_size=config.vision_patch_size,
        num_patches=config.vision_num_positions,
        hidden_act="gelu_pytorch_tanh",
        layer_norm_eps=config.vision_layer_norm_eps,
        attention_dropout=0.0,
        vision_use_head=False,
    )
    hf._attn_implementation = "sdpa"
    return hf


def qwen3_config(config):
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
