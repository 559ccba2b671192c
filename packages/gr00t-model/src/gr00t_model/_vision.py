"""SigLIP2 vision tower and the pixel-unshuffle MLP connector.

Our own modules with the parameter names (and creation order) of transformers' SigLIP2, so release weights load
as they are and building a model does not import transformers' modeling stack (10-15 s of a GPU host's
start-up). The encoder layers move the block-final residual add into the next layer (`VisionLayer`): compiled
one block at a time, that add was a pass of its own over the residual stream (26 us per layer at batch 16
with two cameras on an H200); at the start of the next block it fuses with the first LayerNorm. The
patch/position embedding resizes the position table with Python ints only (every image of a batch has the
same size), where transformers' reads sizes on the host, which breaks CUDA graph capture. Each image is its own
batch row, so images attend only within themselves whatever attention kernel runs. Tests hold every module to
transformers' own.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from ._config import GR00TConfig


def patchify(pixel_values: torch.Tensor, patch: int) -> torch.Tensor:
    """[N, C, H, W] -> [N, (H/p)*(W/p), p*p*C], patches in raster order, each flattened as (row, col, channel)."""
    n, c, h, w = pixel_values.shape
    x = pixel_values.reshape(n, c, h // patch, patch, w // patch, patch)
    return x.permute(0, 2, 4, 3, 5, 1).reshape(n, (h // patch) * (w // patch), patch * patch * c)


class VisionEmbeddings(nn.Module):
    """Linear patch embedding plus the learned position grid resized (bilinear, antialiased) to the patch grid."""

    def __init__(self, config: GR00TConfig) -> None:
        super().__init__()
        width, patch = config.vision_hidden_size, config.vision_patch_size
        self.patch_size = patch
        self.grid = math.isqrt(config.vision_num_positions)
        self.patch_embedding = nn.Linear(3 * patch * patch, width)
        self.position_embedding = nn.Embedding(config.vision_num_positions, width)

    def positions(self, rows: int, cols: int) -> torch.Tensor:
        """[rows*cols, width] position embeddings for a rows x cols patch grid."""
        table = self.position_embedding.weight
        grid = table.float().reshape(self.grid, self.grid, -1).permute(2, 0, 1).unsqueeze(0)
        if (rows, cols) != (self.grid, self.grid):
            grid = F.interpolate(
                grid, size=(rows, cols), mode="bilinear", align_corners=False, antialias=True
            )
        return grid.reshape(table.shape[-1], rows * cols).t()

    def forward(self, pixel_values: torch.Tensor) -> torch.Tensor:
        """[N, 3, H, W] -> [N, (H/p)*(W/p), width]."""
        rows, cols = pixel_values.shape[-2] // self.patch_size, pixel_values.shape[-1] // self.patch_size
        patches = patchify(pixel_values, self.patch_size).to(self.patch_embedding.weight.dtype)
        weight, bias = self.patch_embedding.weight, self.patch_embedding.bias
        if patches.is_cuda and patches.shape[-1] % 8:
            # 588 inputs per patch: rows not 16-byte aligned send cuBLAS to an old sm80 kernel (95 us for
            # n1.6-3b's 32 images on an H200). Zero columns on both sides add exact zeros.
            pad = -patches.shape[-1] % 8
            patches, weight = F.pad(patches, (0, pad)), F.pad(weight, (0, pad))
        embeds = F.linear(patches, weight, bias)
        return embeds + self.positions(rows, cols).to(embeds.dtype)


class VisionAttention(nn.Module):
    """SigLIP2's attention: q/k/v/out projections with bias, SDPA without mask or dropout."""

    def __init__(self, width: int, heads: int) -> None:
        super().__init__()
        self.embed_dim, self.num_heads, self.head_dim = width, heads, width // heads
        self.scale = self.head_dim**-0.5
        # created in transformers' order (k, v, q, out): the same random draws, the same parameter order
        self.k_proj = nn.Linear(width, width)
        self.v_proj = nn.Linear(width, width)
        self.q_proj = nn.Linear(width, width)
        self.out_proj = nn.Linear(width, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        n, s = x.shape[:2]
        q, k, v = (
            proj(x).view(n, s, self.num_heads, self.head_dim).transpose(1, 2)
            for proj in (self.q_proj, self.k_proj, self.v_proj)
        )
        out = F.scaled_dot_product_attention(q, k, v, scale=self.scale)
        return self.out_proj(out.transpose(1, 2).reshape(n, s, -1))


class VisionMLP(nn.Module):
    """fc1 -> tanh-approximated GELU -> fc2."""

    def __init__(self, width: int, hidden: int) -> None:
        super().__init__()
        self.activation_fn = nn.GELU(approximate="tanh")
        self.fc1 = nn.Linear(width, hidden)
        self.fc2 = nn.Linear(hidden, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(self.activation_fn(self.fc1(x)))


class VisionLayer(nn.Module):
    """A SigLIP2 encoder layer (pre-norm attention, then pre-norm MLP) whose forward leaves its MLP's residual
    add to the next layer."""

    def __init__(self, config: GR00TConfig) -> None:
        super().__init__()
        width, eps = config.vision_hidden_size, config.vision_layer_norm_eps
        self.embed_dim = width
        self.layer_norm1 = nn.LayerNorm(width, eps=eps)
        self.self_attn = VisionAttention(width, config.vision_num_heads)
        self.layer_norm2 = nn.LayerNorm(width, eps=eps)
        self.mlp = VisionMLP(width, config.vision_intermediate_size)

    def forward(self, hidden: torch.Tensor, pending: torch.Tensor | None = None):
        """(residual stream, the previous layer's MLP output or None) -> (the stream after this layer's
        attention, this layer's MLP output): the stream after the layer is their sum, the same adds in the
        same order as the plain layer."""
        if pending is not None:
            hidden = hidden + pending
        normed = self.layer_norm1(hidden)
        if hasattr(self.self_attn, "qkv"):  # frozen, q/k/v merged (prepare_frozen_prefix)
            hidden = hidden + merged_attention(self.self_attn, normed)
        else:
            hidden = hidden + self.self_attn(normed)
        return hidden, self.mlp(self.layer_norm2(hidden))


def merged_attention(attn: VisionAttention, x: torch.Tensor) -> torch.Tensor:
    """VisionAttention with q, k and v from one GEMM (`attn.qkv`, a MergedFrozenLinear): the same heads,
    scale and output projection."""
    n, s = x.shape[:2]
    q, k, v = attn.qkv(x).view(n, s, 3, attn.num_heads, attn.head_dim).permute(2, 0, 3, 1, 4)
    out = F.scaled_dot_product_attention(q, k, v, scale=attn.scale)
    return attn.out_proj(out.transpose(1, 2).reshape(n, s, -1))


class _Encoder(nn.Module):
    def __init__(self, layers: list[nn.Module]) -> None:
        super().__init__()
        self.layers = nn.ModuleList(layers)


class VisionTower(nn.Module):
    """SigLIP2 so400m/14 without its pooling head: embeddings, encoder layers, post LayerNorm."""

    def __init__(self, config: GR00TConfig) -> None:
        super().__init__()
        self.embeddings = VisionEmbeddings(config)
        self.encoder = _Encoder([VisionLayer(config) for _ in range(config.vision_num_layers)])
        self.post_layernorm = nn.LayerNorm(config.vision_hidden_size, eps=config.vision_layer_norm_eps)

    def forward(self, pixel_values: torch.Tensor) -> torch.Tensor:
        """[N, 3, H, W] -> [N, H/p, W/p, width] (one image per row: attention stays inside each image)."""
        return self.finish(*self.encode(pixel_values), self.grid_of(pixel_values))

    def grid_of(self, pixel_values: torch.Tensor) -> tuple[int, int]:
        """(rows, cols) of the patch grid."""
        patch = self.embeddings.patch_size
        return pixel_values.shape[-2] // patch, pixel_values.shape[-1] // patch

    def encode(self, pixel_values: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Embeddings and encoder layers: (residual stream, the last layer's MLP output still to add)."""
        hidden, pending = self.embeddings(pixel_values), None
        for layer in self.encoder.layers:
            hidden, pending = layer(hidden, pending)
        return hidden, pending

    def finish(
        self, hidden: torch.Tensor, pending: torch.Tensor | None, grid: tuple[int, int]
    ) -> torch.Tensor:
        """The last residual add and the post LayerNorm, as a [N, rows, cols, width] grid."""
        hidden = self.post_layernorm(hidden if pending is None else hidden + pending)
        return hidden.reshape(hidden.shape[0], *grid, hidden.shape[-1])


def build_connector(config: GR00TConfig) -> nn.Sequential:
    """`mlp1`: LayerNorm(4C) -> Linear(4C, D) -> GELU -> Linear(D, D) on 2x2-unshuffled patch features."""
    merged = config.vision_hidden_size * config.downsample_factor**2
    return nn.Sequential(
        nn.LayerNorm(merged),
        nn.Linear(merged, config.llm_hidden_size),
        nn.GELU(),
        nn.Linear(config.llm_hidden_size, config.llm_hidden_size),
    )


def connect(mlp1: nn.Sequential, features: torch.Tensor, factor: int) -> torch.Tensor:
    """[N, h, w, C] patch grid -> pixel_unshuffle(factor) -> mlp1 -> [N, (h/f)*(w/f), D] tokens in raster order."""
    grid = features.permute(0, 3, 1, 2)
    merged = F.pixel_unshuffle(grid, factor).flatten(2).transpose(1, 2)
    return mlp1(merged)


def init_vision_(tower: VisionTower) -> None:
    """SigLIP-style initialisation: Xavier attention/MLP weights, LeCun-normal patch embedding."""
    emb = tower.embeddings
    nn.init.normal_(emb.patch_embedding.weight, std=emb.patch_embedding.in_features**-0.5)
    nn.init.zeros_(emb.patch_embedding.bias)
    nn.init.normal_(emb.position_embedding.weight, std=emb.position_embedding.embedding_dim**-0.5)
    for layer in tower.encoder.layers:
        for module in layer.modules():
            if isinstance(module, nn.Linear):
                nn.init.xavier_uniform_(module.weight)
                nn.init.zeros_(module.bias)
