"""Tiny GraphedStep scenarios shared by the vla_graph test files (tests/ is on the path; tests/vla_graph is
not importable under a name of its own, vla_graph being the package)."""

from __future__ import annotations

import torch
from torch import nn

GRAPH_MODES = ["per_microbatch", "full_iteration"]


def linear_step(events: list, model: nn.Linear, count: int):
    """A step over one of `count` microbatches: logs the batch index, backpropagates loss / count."""

    def step(batch: dict) -> torch.Tensor:
        events.append(f"step{batch['index']}")
        loss = model(batch["x"]).square().mean()
        (loss / count).backward()
        return loss

    return step


def microbatches(count: int, seed: int = 0) -> list[dict]:
    gen = torch.Generator().manual_seed(seed)
    return [{"x": torch.randn(4, 3, generator=gen), "index": i} for i in range(count)]
