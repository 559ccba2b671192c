"""Linears that read the same input, run as one GEMM, with the parts' own names in state dicts.

The DiT's small projections leave an H200 mostly idle: every block's AdaLN projection reads the same
silu(temb) with 16 rows (a weight-bound [16, 1536] x [1536, 3072] GEMM per block), and a self-attention
block's q, k and v read the same 816 rows. One GEMM over the parts' stacked rows computes each output element
from the same products; the input gradient sums the parts inside the GEMM's fp32 accumulation instead of
after it. `merge_linears` builds one from the parts, so a seeded model starts from the same weights either
way. Checkpoints keep the release's layout: state dicts list the parts under their own names (views of the
merged tensors) and loading folds them back.
"""

from __future__ import annotations

import functools

import torch
from torch import nn


class MergedLinear(nn.Linear):
    """One Linear whose output rows are those of `parts`: (path relative to the owner given to
    `merge_linears`, out_features), in order."""

    def __init__(
        self, in_features: int, parts: list[tuple[str, int]], bias: bool = True, device=None, dtype=None
    ) -> None:
        super().__init__(in_features, sum(rows for _, rows in parts), bias=bias, device=device, dtype=dtype)
        self.parts = list(parts)

    def forward_parts(self, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """Each part's output: views of the one product."""
        return self(x).split([rows for _, rows in self.parts], dim=-1)


def merge_linears(owner: nn.Module, name: str, parts: list[str]) -> MergedLinear:
    """Replace the nn.Linear submodules at `parts` (paths below `owner`, one input size, all with or all
    without bias) by one MergedLinear `owner.<name>` holding their weights and biases, and make `owner`'s
    state dicts keep the parts' names (`expose_parts`)."""
    linears = [owner.get_submodule(path) for path in parts]
    first = linears[0]
    merged = nn.utils.skip_init(  # no initialization of its own: it takes the parts' values
        MergedLinear,
        first.in_features,
        [(path, linear.out_features) for path, linear in zip(parts, linears)],
        bias=first.bias is not None,
        device=first.weight.device,
        dtype=first.weight.dtype,
    )
    with torch.no_grad():
        merged.weight.copy_(torch.cat([linear.weight for linear in linears]))
        if merged.bias is not None:
            merged.bias.copy_(torch.cat([linear.bias for linear in linears]))
    for path in parts:
        parent, _, leaf = path.rpartition(".")
        delattr(owner.get_submodule(parent), leaf)
    setattr(owner, name, merged)
    expose_parts(owner, name)
    return merged


def expose_parts(owner: nn.Module, name: str) -> None:
    """Make `owner`'s state dicts hold its MergedLinear `owner.<name>` as the parts' `<part>.weight` and
    `<part>.bias` (views of the merged tensors, so that copying into them loads the merged one), and make
    `load_state_dict` fold those keys back into the merged ones."""
    owner.register_state_dict_post_hook(functools.partial(_split_state, name=name))
    owner.register_load_state_dict_pre_hook(functools.partial(_merge_state, name=name))


def _tensors(merged: MergedLinear) -> dict[str, torch.Tensor | None]:
    return {"weight": merged.weight, "bias": merged.bias}


def _split_state(owner: nn.Module, state: dict, prefix: str, local_metadata, *, name: str) -> None:
    merged = owner.get_submodule(name)
    for kind, tensor in _tensors(merged).items():
        key = f"{prefix}{name}.{kind}"
        if tensor is None or key not in state:
            continue
        full = state.pop(key)
        with torch.no_grad():  # plain views, which loading may copy into (they write the merged tensor)
            for (part, _), piece in zip(merged.parts, full.split([rows for _, rows in merged.parts])):
                state[f"{prefix}{part}.{kind}"] = piece


def _merge_state(
    owner, state: dict, prefix: str, local_metadata, strict, missing, unexpected, errors, *, name
):
    merged = owner.get_submodule(name)
    for kind, tensor in _tensors(merged).items():
        keys = [f"{prefix}{part}.{kind}" for part, _ in merged.parts]
        if tensor is not None and all(k in state for k in keys):  # else the merged key is reported missing
            state[f"{prefix}{name}.{kind}"] = torch.cat([state.pop(k) for k in keys])
