"""`param.grad` under ZeRO-1: a placeholder that raises a clear error instead of letting code see no gradient.

After a reduce-scatter each rank holds only its shard of every gradient, so there is no full `.grad` to
expose. Left None, `torch.nn.utils.clip_grad_norm_(model.parameters())` silently returns 0 and clips nothing.
The placeholder has the parameter's shape, dtype and device (so it can be a `.grad`) but no data of its own:
any operation on it (a norm, an in-place scale, autograd accumulating a late gradient into it) raises an
error that names the parameter and the calls to use instead. It is set once the step's gradients are
synchronized and cleared by `zero_grad()`.
"""

from __future__ import annotations

from typing import Any

import torch


class ShardedGrad(torch.Tensor):
    """Placeholder `.grad` of a parameter whose gradient DistributedAdamW holds sharded over ranks."""

    _name: str

    @staticmethod
    def __new__(cls, storage: torch.Tensor, shape: torch.Size, name: str) -> ShardedGrad:
        # One element of `storage` seen with zero strides: the shape of the parameter, no memory, and an
        # address of its own (vla_graph compares .grad addresses before and after capture).
        grad = torch.Tensor._make_subclass(cls, storage.expand(shape))
        grad._name = name
        return grad

    __torch_function__ = torch._C._disabled_torch_function_impl

    def __repr__(self) -> str:  # printing must not raise
        return (
            f"ShardedGrad({self._name!r}, shape={tuple(self.shape)}, dtype={self.dtype}: sharded over ranks)"
        )

    @classmethod
    def __torch_dispatch__(cls, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        names = [a._name for a in args if isinstance(a, ShardedGrad)]
        for value in args:
            if isinstance(value, (list, tuple)):
                names += [a._name for a in value if isinstance(a, ShardedGrad)]
        shown = ", ".join(repr(n) for n in names[:3]) + (" ..." if len(names) > 3 else "")
        raise RuntimeError(
            f"{func} on the .grad of {shown}: with DistributedAdamW (ZeRO-1) each rank holds only its shard of "
            "the synchronized gradients, so .grad is a placeholder until zero_grad(). To clip, call "
            "optimizer.clip_grad_norm_(max_norm) (or model.clip_grad_norm_(max_norm), which calls it) "
            "instead of torch.nn.utils.clip_grad_norm_. A backward pass after the step's gradient sync "
            "needs model.zero_grad() (or optimizer.zero_grad()) first."
        )


def placeholders(params: list[torch.nn.Parameter], names: list[str]) -> list[ShardedGrad]:
    """One placeholder per parameter, all viewing one small tensor per dtype."""
    bases: dict[torch.dtype, torch.Tensor] = {}
    for p in params:
        bases.setdefault(p.dtype, torch.zeros(len(params), dtype=p.dtype, device=p.device))
    return [ShardedGrad(bases[p.dtype][i], p.shape, name) for i, (p, name) in enumerate(zip(params, names))]
