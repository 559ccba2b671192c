"""Optimizer parameter groups: weight decay on matrices only, not on biases and norm scales."""

from __future__ import annotations

from collections.abc import Iterable

from torch import nn


def param_groups(named: Iterable[tuple[str, nn.Parameter]], weight_decay: float) -> list[dict]:
    """Trainable parameters split into a decayed group (ndim >= 2) and an undecayed one."""
    decay, no_decay = [], []
    for _, param in named:
        if param.requires_grad:
            (decay if param.ndim >= 2 else no_decay).append(param)
    groups = [{"params": decay, "weight_decay": weight_decay}, {"params": no_decay, "weight_decay": 0.0}]
    groups = [g for g in groups if g["params"]]
    if not groups:
        raise ValueError("the model has no trainable parameters (all have requires_grad=False)")
    return groups
