"""Synthetic batches with the model's exact input layout (benchmarks, graph-capture tests, smoke runs)."""

from __future__ import annotations

import torch

from ._config import GR00TConfig


def make_dummy_batch(
    config: GR00TConfig,
    batch_size: int,
    *,
    num_images: int = 1,
    text_tokens: int | None = None,
    device: str | torch.device = "cpu",
    seed: int = 0,
) -> dict[str, torch.Tensor]:
    """A random batch shaped like the processor's output.

    Each row is `text_tokens` ordinary tokens (default 28 + 7 per image, the release's prompt overhead) followed
    by `num_images` runs of `<IMG_CONTEXT>` tokens; the action chunk is real on its first half of the
    horizon and first half of the dims, padded after.
    """
    if batch_size <= 0 or num_images <= 0:
        raise ValueError(f"batch_size and num_images must be > 0, got {batch_size}, {num_images}")
    gen = torch.Generator().manual_seed(seed)
    c = config
    text = 28 + 7 * num_images if text_tokens is None else text_tokens
    image_run = c.image_tokens_per_image * num_images
    ids = torch.randint(0, c.vocab_size, (batch_size, text + image_run), generator=gen)
    ids[ids == c.image_token_id] = (c.image_token_id + 1) % c.vocab_size
    ids[:, text:] = c.image_token_id
    height, width = c.image_size
    horizon, dims = c.action_horizon, c.max_action_dim
    mask = torch.zeros(batch_size, horizon, dims)
    mask[:, : max(1, horizon // 2), : max(1, dims // 2)] = 1.0
    batch = {
        "input_ids": ids,
        "attention_mask": torch.ones_like(ids, dtype=torch.bool),
        "pixel_values": torch.rand(batch_size, num_images, 3, height, width, generator=gen) * 2 - 1,
        "state": torch.rand(batch_size, 1, c.max_state_dim, generator=gen) * 2 - 1,
        "action": (torch.rand(batch_size, horizon, dims, generator=gen) * 2 - 1) * mask,
        "action_mask": mask,
        "embodiment_id": torch.randint(0, c.max_num_embodiments, (batch_size,), generator=gen),
    }
    return {k: v.to(device) for k, v in batch.items()}
