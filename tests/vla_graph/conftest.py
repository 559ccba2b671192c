"""Shared toy model for vla_graph tests: a small flow-matching transformer that takes pre-drawn time and
noise tensors, with optional dropout. Attention is written out (no fused kernels) so that eager and graphed
runs execute the same deterministic kernels and can be compared bitwise."""

from __future__ import annotations

import math

import pytest
import torch
import vla_graph
from torch import nn


class Block(nn.Module):
    def __init__(self, width: int, heads: int, dropout: float) -> None:
        super().__init__()
        self.heads = heads
        self.norm1 = nn.LayerNorm(width)
        self.qkv = nn.Linear(width, 3 * width)
        self.proj = nn.Linear(width, width)
        self.norm2 = nn.LayerNorm(width)
        self.mlp = nn.Sequential(nn.Linear(width, 4 * width), nn.GELU(), nn.Linear(4 * width, width))
        self.drop = nn.Dropout(dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, n, d = x.shape
        q, k, v = self.qkv(self.norm1(x)).view(b, n, 3, self.heads, d // self.heads).permute(2, 0, 3, 1, 4)
        weights = torch.softmax(q @ k.transpose(-1, -2) / math.sqrt(d // self.heads), dim=-1)
        attended = (self.drop(weights) @ v).transpose(1, 2).reshape(b, n, d)
        x = x + self.drop(self.proj(attended))
        return x + self.drop(self.mlp(self.norm2(x)))


class ToyTransformer(nn.Module):
    """Predicts the flow-matching velocity of `actions` given pre-drawn `t` [B] and `noise`."""

    def __init__(
        self, features: int = 6, width: int = 32, heads: int = 4, layers: int = 2, dropout: float = 0.0
    ):
        super().__init__()
        self.inp = nn.Linear(features, width)
        self.time = nn.Sequential(nn.Linear(16, width), nn.SiLU(), nn.Linear(width, width))
        self.blocks = nn.ModuleList(Block(width, heads, dropout) for _ in range(layers))
        self.out = nn.Linear(width, features)

    def time_features(self, t: torch.Tensor) -> torch.Tensor:
        freqs = torch.exp(-math.log(1e4) * torch.arange(8, device=t.device, dtype=t.dtype) / 8)
        angles = t[:, None] * 1000 * freqs
        return torch.cat([angles.sin(), angles.cos()], dim=-1)

    def loss(self, batch: dict) -> torch.Tensor:
        actions, t, noise = batch["actions"], batch["t"], batch["noise"]
        noisy = (1 - t[:, None, None]) * noise + t[:, None, None] * actions
        h = self.inp(noisy) + self.time(self.time_features(t))[:, None, :]
        for block in self.blocks:
            h = block(h)
        error = (self.out(h) - (actions - noise)) ** 2
        return vla_graph.masked_mean(error, batch["valid"])


def make_microbatches(
    iterations: int,
    count: int,
    *,
    batch: int = 4,
    tokens: int = 5,
    features: int = 6,
    device: str | torch.device = "cpu",
    seed: int = 0,
) -> list[list[dict]]:
    """Fixed-shape microbatches, with a few padded (invalid) tokens so the mask matters."""
    gen = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(iterations):
        group = []
        for _ in range(count):
            actions = torch.randn(batch, tokens, features, generator=gen)
            lengths = torch.randint(tokens - 2, tokens + 1, (batch,), generator=gen)
            valid = torch.arange(tokens)[None, :] < lengths[:, None]
            group.append({"actions": actions.to(device), "valid": valid.to(device)})
        out.append(group)
    return out


def draws_for(
    batch_size: int, tokens: int, features: int, generator: torch.Generator
) -> vla_graph.RandomDraws:
    return vla_graph.RandomDraws(
        {
            "t": vla_graph.RandomSpec(shape=(batch_size,), distribution="uniform"),
            "noise": vla_graph.RandomSpec(shape=(batch_size, tokens, features)),
        },
        generator=generator,
    )


def run_training(
    mode: str,
    *,
    iterations: int,
    count: int,
    dropout: float,
    device: str = "cpu",
    model_seed: int = 0,
    optimizer: str = "sgd",
    compile_backend: str | None = None,
    **config,
) -> dict:
    """Train a fresh toy model in `mode`; return per-iteration losses and gradients. With `compile_backend`,
    every block's forward is torch.compile'd (as gr00t_model.compile_blocks does)."""
    torch.manual_seed(model_seed)
    model = ToyTransformer(dropout=dropout).to(device)
    if compile_backend is not None:
        for block in model.blocks:
            block.forward = torch.compile(block.forward, backend=compile_backend, dynamic=False)
    torch.manual_seed(1234)  # the dropout stream starts at the same point in every mode
    if device != "cpu":
        torch.cuda.manual_seed(1234)
    draw_gen = torch.Generator(device=device).manual_seed(99)
    step = vla_graph.GraphedStep(
        lambda b: _backward(model.loss(b), count),
        params=model.named_parameters(),
        config=vla_graph.GraphConfig(mode=mode, **config),
        draw=draws_for(4, 5, 6, draw_gen),
    )
    opt = (
        torch.optim.SGD(model.parameters(), lr=0.05)
        if optimizer == "sgd"
        else torch.optim.AdamW(model.parameters(), lr=1e-3)
    )
    losses, grads = [], []
    for group in make_microbatches(iterations, count, device=device):
        losses.append(torch.stack(step(group)))
        grads.append([p.grad.clone() for p in model.parameters()])
        opt.step()
        opt.zero_grad(set_to_none=True)
    return {"losses": torch.stack(losses), "grads": grads, "model": model, "step": step}


def _backward(loss: torch.Tensor, count: int) -> torch.Tensor:
    (loss / count).backward()
    return loss


@pytest.fixture
def toy():
    """The toy helpers, as a namespace (test modules cannot import each other)."""

    class Toy:
        Transformer = ToyTransformer
        microbatches = staticmethod(make_microbatches)
        draws = staticmethod(draws_for)
        train = staticmethod(run_training)

    return Toy


@pytest.fixture(autouse=True)
def _one_thread():
    """Tiny models run faster and steadier on one thread, especially on a shared 2-core machine."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)
