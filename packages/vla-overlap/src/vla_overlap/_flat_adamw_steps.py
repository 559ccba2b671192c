"""FlatAdamW's step of one bucket: `torch_step`, the arithmetic in torch ops (torch AdamW's order of operations;
the reference the Triton kernel is tested against, and the CPU path), and `triton_step`, the kernel. A bucket
with 8-bit moments (a "exp_avg_scale" entry) goes to _moments8's torch form or its kernel."""

from __future__ import annotations

from typing import Any

import torch

from ._moments8 import torch_step8
from ._remainders import decode, encode_


def torch_step(flat: dict[str, Any], table: torch.Tensor, coef: torch.Tensor | None,
                idle: torch.Tensor | None) -> None:  # fmt: skip
    """The kernel's arithmetic in torch ops (torch AdamW's order of operations), run by run (block by block
    where rows are tracked: an idle block only decays)."""
    if flat.get("exp_avg_scale") is not None:
        return torch_step8(flat, table, coef, idle)
    if idle is None:
        pieces = [(start, end, row, False) for start, end, row in flat["runs"]]
    else:  # blocks may run into the zero padding after a parameter, which AdamW keeps at zero
        blocks = zip(flat["blocks"].tolist(), idle.tolist())
        pieces = [(start, start + length, row, skip) for (start, length, row), skip in blocks]
    rem = flat.get("rem")
    for start, end, row, skip in pieces:
        decay, beta1, beta2, eps, step_size, bc2 = table[row, :6].unbind()
        window = slice(start, end)
        # with remainders the master is decoded, stepped, and written back as parameter and remainder
        p = flat["master"][window] if rem is None else decode(flat["out"][window], rem[window])
        if skip:
            p.mul_(decay)
        else:
            m, v = flat["exp_avg"][window], flat["exp_avg_sq"][window]
            g = flat["grad"][window].float()  # bf16 gradients are read in place (exact widening)
            g = g if coef is None else g * coef
            p.mul_(decay)
            m.lerp_(g, 1 - beta1)
            v.mul_(beta2).add_((1 - beta2) * g * g)
            p.sub_(step_size * m / (v.sqrt() / bc2 + eps))
        if rem is not None:
            encode_(p, flat["out"][window], rem[window])
        elif flat["out"] is not None:
            flat["out"][window].copy_(p)


def triton_step(flat: dict[str, Any], table: torch.Tensor, coef: torch.Tensor | None,
                 idle: torch.Tensor | None) -> None:  # fmt: skip
    if flat.get("exp_avg_scale") is not None:
        from ._moments8_kernel import adamw8_flat

        return adamw8_flat(flat["master"], flat["grad"], flat["exp_avg"], flat["exp_avg_sq"], flat["exp_avg_scale"],
                           flat["exp_avg_sq_scale"], flat["out"], flat["blocks"], table, coef, idle=idle,
                           remainder=flat.get("rem"))  # fmt: skip
    from ._flat_adamw_kernel import adamw_flat

    adamw_flat(flat["master"], flat["grad"], flat["exp_avg"], flat["exp_avg_sq"], flat["out"],
               flat["blocks"], table, coef, align=flat.get("align", 1), idle=idle,
               remainder=flat.get("rem"))  # fmt: skip
