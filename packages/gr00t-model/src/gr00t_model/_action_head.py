"""The flow-matching action head: per-embodiment encoders/decoder around the DiT, loss and Euler inference."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from ._config import GR00TConfig
from ._dit import AlternateVLDiT
from ._grouped_matmul import SlotGroups, grouped_supported, slot_matmul, slot_tensor


class CategorySpecificLinear(nn.Module):
    """One linear layer per embodiment slot: W [E, in, out], b [E, out]; rows pick their slot's weights.
    `grouped` (GR00TConfig.grouped_embodiment_gemms) computes the product as one grouped GEMM over the batch
    sorted by slot where torch supports it here, instead of the release's per-sample gather and bmm."""

    def __init__(self, slots: int, fan_in: int, fan_out: int, grouped: bool = False) -> None:
        super().__init__()
        self.W = nn.Parameter(0.02 * torch.randn(slots, fan_in, fan_out))
        self.b = nn.Parameter(torch.zeros(slots, fan_out))
        self.grouped = grouped

    def forward(self, x: torch.Tensor, slot: torch.Tensor | SlotGroups) -> torch.Tensor:
        """x [B, T, in], slot [B] (or its SlotGroups) -> [B, T, out]."""
        if self.grouped and grouped_supported(x, self.W):
            return slot_matmul(x, self.W, slot) + self.b[slot_tensor(slot)][:, None]
        slot = slot_tensor(slot)
        return torch.bmm(x, self.W[slot]) + self.b[slot][:, None]


class CategorySpecificMLP(nn.Module):
    """layer1 -> ReLU -> layer2, per embodiment slot."""

    def __init__(self, slots: int, fan_in: int, hidden: int, fan_out: int) -> None:
        super().__init__()
        self.layer1 = CategorySpecificLinear(slots, fan_in, hidden)
        self.layer2 = CategorySpecificLinear(slots, hidden, fan_out)

    def forward(self, x: torch.Tensor, slot: torch.Tensor) -> torch.Tensor:
        return self.layer2(F.relu(self.layer1(x, slot)), slot)


def bucket_sinusoid(buckets: torch.Tensor, length: int, width: int) -> torch.Tensor:
    """[B] buckets -> [B, length, width]: sines then cosines, frequencies exp(-i ln(1e4) / (width / 2))."""
    half = width // 2
    freqs = torch.exp(
        -torch.arange(half, device=buckets.device, dtype=torch.float32) * (math.log(10000.0) / half)
    )
    angles = buckets.float()[:, None] * freqs[None, :]
    return torch.cat((angles.sin(), angles.cos()), dim=-1)[:, None].expand(-1, length, -1)


class MultiEmbodimentActionEncoder(nn.Module):
    """a = W1(x); h = swish(W2([a, sinusoid(bucket)])); out = W3(h)."""

    def __init__(self, action_dim: int, width: int, slots: int) -> None:
        super().__init__()
        self.width = width
        self.W1 = CategorySpecificLinear(slots, action_dim, width)
        self.W2 = CategorySpecificLinear(slots, 2 * width, width)
        self.W3 = CategorySpecificLinear(slots, width, width)

    def forward(self, actions: torch.Tensor, buckets: torch.Tensor, slot: torch.Tensor) -> torch.Tensor:
        a = self.W1(actions, slot)
        tau = bucket_sinusoid(buckets, actions.shape[1], self.width).to(a.dtype)
        return self.W3(F.silu(self.W2(torch.cat((a, tau), dim=-1), slot)), slot)


class ActionHead(nn.Module):
    """`vlln`, `state_encoder`, `action_encoder`, `model` (the DiT), `action_decoder`, `position_embedding`."""

    def __init__(self, config: GR00TConfig) -> None:
        super().__init__()
        self.config = config
        slots, width = config.max_num_embodiments, config.input_embedding_dim
        self.model = AlternateVLDiT(config)
        self.state_encoder = CategorySpecificMLP(slots, config.max_state_dim, config.hidden_size, width)
        self.action_encoder = MultiEmbodimentActionEncoder(config.max_action_dim, width, slots)
        self.action_decoder = CategorySpecificMLP(
            slots, config.hidden_size, config.hidden_size, config.max_action_dim
        )
        self.vlln = nn.LayerNorm(config.llm_hidden_size)
        self.position_embedding = nn.Embedding(config.max_seq_len, width)
        nn.init.normal_(self.position_embedding.weight, std=0.02)
        if config.state_dropout_prob > 0:
            self.mask_token = nn.Parameter(0.02 * torch.randn(1, 1, width))
        for layer in self.embodiment_layers():
            layer.grouped = config.grouped_embodiment_gemms

    def slot_groups(self, slot: torch.Tensor) -> torch.Tensor | SlotGroups:
        """With grouped GEMMs, the batch sorted by slot once for every per-embodiment layer of a forward."""
        return (
            SlotGroups(slot, self.config.max_num_embodiments)
            if self.config.grouped_embodiment_gemms
            else slot
        )

    def embodiment_layers(self) -> list[CategorySpecificLinear]:
        """The per-embodiment projections of the state encoder, action encoder and action decoder."""
        return [m for m in self.modules() if isinstance(m, CategorySpecificLinear)]

    def sample_time(self, batch: int, device: torch.device) -> torch.Tensor:
        """t = noise_s * (1 - u), u ~ Beta(alpha, beta); inverse-CDF draws when a parameter is 1 (graph-safe)."""
        alpha, beta = self.config.noise_beta_alpha, self.config.noise_beta_beta
        r = torch.rand(batch, device=device)
        if beta == 1.0:
            u = r ** (1.0 / alpha)
        elif alpha == 1.0:
            u = 1.0 - r ** (1.0 / beta)
        else:
            concentration = torch.tensor([alpha, beta], device=device)
            u = torch.distributions.Beta(concentration[0], concentration[1], validate_args=False).sample(
                (batch,)
            )
        return self.config.noise_s * (1.0 - u)

    def buckets(self, t: torch.Tensor) -> torch.Tensor:
        """floor(t * num_timestep_buckets) as int64."""
        return (t * self.config.num_timestep_buckets).long()

    def encode_state(self, state: torch.Tensor, slot: torch.Tensor) -> torch.Tensor:
        """[B, 1, max_state_dim] -> one state token [B, 1, width]; state dropout in training."""
        weight = self.state_encoder.layer1.W
        tokens = self.state_encoder(state.to(weight.dtype), slot)
        if self.training and self.config.state_dropout_prob > 0:
            drop = torch.rand(tokens.shape[0], 1, 1, device=tokens.device) < self.config.state_dropout_prob
            tokens = torch.where(drop, self.mask_token.to(tokens.dtype), tokens)
        return tokens

    def velocity(self, vl, masks, state_tokens, noisy, buckets, slot, kv_cache=None) -> torch.Tensor:
        """One DiT evaluation: predicted velocity [B, Ta, max_action_dim]."""
        horizon = noisy.shape[1]
        actions = self.action_encoder(noisy.to(self.action_encoder.W1.W.dtype), buckets, slot)
        actions = actions + self.position_embedding.weight[:horizon].to(actions.dtype)
        tokens = torch.cat((state_tokens.to(actions.dtype), actions), dim=1)
        out = self.model(tokens, vl, buckets, masks[0], masks[1], kv_cache)
        return self.action_decoder(out, slot)[:, -horizon:]

    def features(self, features: torch.Tensor, valid: torch.Tensor, image_mask: torch.Tensor):
        """vlln(features) and the (text, image) cross-attention masks."""
        return self.vlln(features), ((~image_mask) & valid, image_mask & valid)

    def loss(self, vl, masks, state, action, action_mask, slot, noise, t) -> torch.Tensor:
        """Masked MSE between predicted and true velocity (action - noise) at x_t = (1 - t) noise + t action."""
        mask = action_mask.to(torch.float32)
        action = action.to(torch.float32) * mask  # padded entries never reach the model
        tt = t.to(torch.float32)[:, None, None]
        noisy = (1 - tt) * noise + tt * action
        slot = self.slot_groups(slot)
        pred = self.velocity(vl, masks, self.encode_state(state, slot), noisy, self.buckets(t), slot)
        err = (pred.float() - (action - noise)) ** 2 * mask  # fp32 operands: autocast leaves these in fp32
        return err.sum() / (mask.sum() + 1e-6)

    @torch.no_grad()
    def sample(self, vl, masks, state, slot, noise: torch.Tensor, steps: int) -> torch.Tensor:
        """Euler integration of the velocity field from noise at tau = 0, 1/steps, ... -> actions [B, Ta, D]."""
        slot = self.slot_groups(slot)
        state_tokens = self.encode_state(state, slot)
        kv_cache = self.model.cross_key_values(vl)
        x = noise.to(torch.float32)
        for i in range(steps):
            bucket = int(i / steps * self.config.num_timestep_buckets)
            buckets = torch.full((x.shape[0],), bucket, dtype=torch.long, device=x.device)
            x = x + self.velocity(vl, masks, state_tokens, x, buckets, slot, kv_cache).float() / steps
        return x
