"""AdamW with the usual decay split: weight decay on matrices only, not on biases and norm scales."""

from __future__ import annotations

from collections.abc import Iterable

import torch
from torch import nn

from ._config import OptimConfig


def param_groups(named: Iterable[tuple[str, nn.Parameter]], weight_decay: float) -> list[dict]:
    """Trainable parameters split into a decayed group (ndim >= 2) and an undecayed one."""
    decay, no_decay = [], []
    for _, param in named:
        if param.requires_grad:
            (decay if param.ndim >= 2 else no_decay).append(param)
    groups = [{"params": decay, "weight_decay": weight_decay}, {"params": no_decay, "weight_decay": 0.0}]
    return [g for g in groups if g["params"]]


def build_adamw(model: nn.Module, cfg: OptimConfig, fused: bool) -> torch.optim.AdamW:
    """torch AdamW over the trainable parameters, fused (one kernel for all tensors) when asked for."""
    groups = param_groups(model.named_parameters(), cfg.weight_decay)
    if not groups:
        raise ValueError("the model has no trainable parameters (all have requires_grad=False)")
    # Unfused = torch's default implementation, what the reference fine-tuning uses (HF `adamw_torch`).
    kwargs = {"fused": True} if fused else {}
    return torch.optim.AdamW(groups, lr=cfg.lr, betas=cfg.betas, eps=cfg.eps, **kwargs)
