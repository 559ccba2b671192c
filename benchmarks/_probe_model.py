"""The model the step probes time: n1.6-3b with random weights, bf16 working weights, the frozen prefix
prepared and the repeated blocks compiled, as gr00t-train's full stack runs it, and a dummy batch of 16."""

from __future__ import annotations

import torch
from gr00t_model import GR00TN16, GR00TConfig, make_dummy_batch


def full_model_and_batch(**overrides) -> tuple[GR00TN16, dict]:
    """(model in train mode on CUDA, batch); `overrides` are GR00TConfig fields (e.g. triton_attention)."""
    config = GR00TConfig.preset("n1.6-3b", image_size=(252, 252), trainable_dtype="bfloat16", **overrides)
    torch.manual_seed(0)
    with torch.device("cuda"):
        model = GR00TN16(config).train()
    model.prepare_frozen_prefix()
    model.compile_blocks()
    return model, make_dummy_batch(config, 16, num_images=2, device=torch.device("cuda"))
