"""The VLM backbone: vision tower -> connector -> image tokens placed at `<IMG_CONTEXT>` -> truncated Qwen3."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from ._config import GR00TConfig
from ._language import LanguageModel, init_language_
from ._vision import VisionTower, build_connector, connect, init_vision_

PIXEL_MEAN = 0.5
PIXEL_STD = 0.5


class Backbone(nn.Module):
    """`vision_model`, `mlp1`, `language_model`; returns VL features with their validity and image masks."""

    def __init__(self, config: GR00TConfig) -> None:
        super().__init__()
        self.config = config
        self.vision_model = VisionTower(config)
        self.mlp1 = build_connector(config)
        self.language_model = LanguageModel(config)
        init_vision_(self.vision_model)
        init_language_(self.language_model)

    def image_tokens(self, pixel_values: torch.Tensor) -> torch.Tensor:
        """[B, N, 3, H, W] (uint8 frames or normalized floats) -> [B, N * tokens_per_image, D] in prompt order."""
        batch, count = pixel_values.shape[:2]
        images = pixel_values.flatten(0, 1)
        if images.dtype == torch.uint8:
            images = (images.float() / 255.0 - PIXEL_MEAN) / PIXEL_STD
        hidden, pending = self.vision_model.encode(images)
        tokens = self.connect_features(hidden, pending, self.vision_model.grid_of(images))
        return tokens.reshape(batch, count * tokens.shape[1], tokens.shape[2])

    def connect_features(
        self, hidden: torch.Tensor, pending: torch.Tensor | None, grid: tuple[int, int]
    ) -> torch.Tensor:
        """The vision tower's encoder output -> post LayerNorm -> connector: [N, tokens_per_image, D]. One of
        the once-per-step pieces `GR00TN16.compile_blocks` compiles too (eager, its fp32 LayerNorms and
        pixel-unshuffle copies took 0.4 ms per step on an H200)."""
        features = self.vision_model.finish(hidden, pending, grid)
        return connect(self.mlp1, features, self.config.downsample_factor)

    def embed(
        self, input_ids: torch.Tensor, attention_mask: torch.Tensor, pixel_values: torch.Tensor
    ) -> FrozenPrefix:
        """Token embeddings with the image tokens placed, before any LLM layer (`layers_done` = 0).

        The k-th `<IMG_CONTEXT>` token of a row receives the k-th image token of that row. The batch must hold
        exactly N * tokens_per_image of them per row (the processor guarantees it; `GR00TN16.validate_batch`
        checks it eagerly): the placement is a gather, so it never reads the count on the host.
        """
        valid = attention_mask.bool()
        image_mask = input_ids == self.config.image_token_id
        embeds = self.place(
            self.language_model.embed_tokens(input_ids), self.image_tokens(pixel_values), image_mask
        )
        return FrozenPrefix(embeds, valid, image_mask, 0)

    def place(self, embeds: torch.Tensor, images: torch.Tensor, image_mask: torch.Tensor) -> torch.Tensor:
        """The k-th image token of a row into its k-th `<IMG_CONTEXT>` position (compiled by compile_blocks)."""
        order = (image_mask.long().cumsum(dim=1) - 1).clamp(0, images.shape[1] - 1)
        placed = images.gather(1, order[..., None].expand(-1, -1, images.shape[-1]))
        return torch.where(image_mask[..., None], placed.to(embeds.dtype), embeds)

    def once_per_step(self) -> list[tuple[nn.Module, str]]:
        """The eager pieces around the repeated blocks that `GR00TN16.compile_blocks` compiles too, as
        (owner, method name): the patch embedding, the post LayerNorm with the connector, the placement, the
        Qwen3 runs' RoPE tables and mask (about 20 small kernels per run eagerly) and Qwen3's final RMSNorm."""
        lm = self.language_model
        return [
            (self.vision_model.embeddings, "forward"),
            (self, "connect_features"),
            (self, "place"),
            (lm, "tables"),
            (lm.norm, "forward"),
        ]

    def frozen_depth(self) -> int | None:
        """How many leading LLM layers read only frozen weights, with the vision tower, connector and token
        embeddings frozen too; None when one of those trains (then nothing runs before a trainable weight)."""
        lm = self.language_model
        if any(
            p.requires_grad for m in (self.vision_model, self.mlp1, lm.embed_tokens) for p in m.parameters()
        ):
            return None
        depth = 0
        for layer in lm.layers:
            if any(p.requires_grad for p in layer.parameters()):
                break
            depth += 1
        return depth

    def frozen_prefix(
        self, input_ids: torch.Tensor, attention_mask: torch.Tensor, pixel_values: torch.Tensor
    ) -> FrozenPrefix | None:
        """Everything up to the first trainable weight (vision tower, connector, embeddings, frozen LLM
        layers); None when the vision side trains. Reads no trainable parameter."""
        depth = self.frozen_depth()
        if depth is None:
            return None
        prefix = self.embed(input_ids, attention_mask, pixel_values)
        prefix.hidden = self.language_model.run_layers(prefix.hidden, prefix.valid, 0, depth)
        prefix.layers_done = depth
        return prefix

    def forward(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor,
        pixel_values: torch.Tensor,
        prefix: FrozenPrefix | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Returns (features [B, S, D] after the final norm, valid [B, S] bool, image_mask [B, S] bool),
        continuing from `prefix` (the same batch's `frozen_prefix`) when given."""
        if prefix is None:
            prefix = self.embed(input_ids, attention_mask, pixel_values)
        lm = self.language_model
        hidden = lm.run_layers(prefix.hidden, prefix.valid, prefix.layers_done, len(lm.layers))
        return lm.norm(hidden), prefix.valid, prefix.image_mask


@dataclass
class FrozenPrefix:
    """The backbone's state after its frozen part: LLM hidden states after `layers_done` layers."""

    hidden: torch.Tensor
    valid: torch.Tensor
    image_mask: torch.Tensor
    layers_done: int
