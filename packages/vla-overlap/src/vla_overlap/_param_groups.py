"""The parameter groups given to a DistributedAdamW, checked against the wrapped module's trainable parameters."""

from __future__ import annotations

from typing import Any

import torch

from ._wrapper import OverlapDataParallel


def user_groups(model: OverlapDataParallel, params: Any) -> list[dict[str, Any]]:
    """Normalize `params` (None = every trainable parameter) into groups of known, distinct parameters."""
    if params is None:
        params = model.trainable_parameters()
    if isinstance(params, torch.Tensor):
        raise TypeError("params must be an iterable of parameters or of dicts, not a single tensor")
    groups = list(params)
    groups = [dict(g) for g in groups] if groups and isinstance(groups[0], dict) else [{"params": groups}]
    seen: set[int] = set()
    names = {id(p): n for n, p in model.module.named_parameters()}
    for index, group in enumerate(groups):
        given = list(group["params"]) if not isinstance(group["params"], torch.Tensor) else [group["params"]]
        # Frozen parameters never get a gradient: skipped, as torch optimizers skip them at each step.
        group["params"] = [p for p in given if p.requires_grad]
        for param in group["params"]:
            if id(param) not in model._slot_of:
                where = names.get(id(param), f"a tensor of shape {tuple(param.shape)}")
                raise ValueError(
                    f"param_groups[{index}] holds {where!r}, which is not a trainable parameter of the wrapped "
                    "module (parameters frozen when the wrapper was built are not bucketed)"
                )
            if id(param) in seen:
                raise ValueError(f"parameter {names[id(param)]!r} appears in more than one parameter group")
            seen.add(id(param))
    if not seen:
        raise ValueError(
            "DistributedAdamW got no trainable parameter (frozen ones, requires_grad=False, are skipped)"
        )
    return groups
