"""FlatAdamW: DistributedAdamW's step as one pass over each bucket's flat shard.

torch's fused AdamW walks ~700 parameter views per step in chunks and reaches about half the memory bandwidth
of an H200; the bf16 copy of the parameters and the gradient clipping are two more passes. Here every
bucket's shard is contiguous (master weights, gradients, both moments), so one kernel per bucket reads the
gradient (scaled by the clipping coefficient on the fly), updates the moments and the fp32 master, and writes
the bf16 parameter copy in the same pass. Hyperparameters come from a small per-group table, looked up
through a uint8 group id per element (255 marks padding between parameters, left untouched).

The moments stay visible as the inner torch AdamW's per-parameter state (views into the flat buffers), so
state dicts, schedulers and inspection work as before. `kernel="triton"` runs on CUDA; `kernel="torch"` is
the same arithmetic in torch ops (the reference the Triton kernel is tested against, and the CPU path of the
tests).
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

import torch

if TYPE_CHECKING:
    from ._optimizer import DistributedAdamW

PADDING = 255


def flat_supported(opt: DistributedAdamW, kernel: str) -> str | None:
    """Why the flat step cannot run for this optimizer (None when it can)."""
    if len(opt.param_groups) >= PADDING:
        return f"{len(opt.param_groups)} parameter groups (at most {PADDING - 1})"
    for group in opt.param_groups:
        for key in ("amsgrad", "maximize", "differentiable", "capturable"):
            if group.get(key):
                return f"{key}=True"
    if kernel == "triton":
        if not torch.cuda.is_available() or opt.masters[0].device.type != "cuda":
            return "the parameters are not on a CUDA device"
        try:
            import triton  # noqa: F401
        except ImportError:
            return "Triton is not installed"
    return None


class FlatAdamW:
    """The flat per-bucket AdamW step of a DistributedAdamW (see the module docstring)."""

    def __init__(self, opt: DistributedAdamW, kernel: str) -> None:
        self.opt, self.kernel = opt, kernel
        gather = opt._model._gather
        self.buckets = []
        for bucket, master in enumerate(opt.masters):
            shard = gather.shard_view(bucket)
            group_ids = torch.full((master.numel(),), PADDING, dtype=torch.uint8, device=master.device)
            self.buckets.append(
                {
                    "master": master,
                    "grad": opt._grad_shards[bucket],
                    "exp_avg": torch.zeros_like(master),
                    "exp_avg_sq": torch.zeros_like(master),
                    # the bf16 parameters, written in the same pass (fp32 parameters are their own masters)
                    "out": None if shard.data_ptr() == master.data_ptr() else shard,
                    "group_ids": group_ids,
                }
            )
        group_of = {id(p): g for g, group in enumerate(opt.param_groups) for p in group["params"]}
        for bucket, piece, master in opt.pieces:
            start = piece.shard_start
            self.buckets[bucket]["group_ids"][start : start + piece.numel] = group_of[id(master)]
        self.steps = [0] * len(opt.param_groups)
        self.relink()

    def relink(self) -> None:
        """Make the inner AdamW's per-parameter state views into the flat buffers (copying what a state
        dict load put there), and read the step counts."""
        opt = self.opt
        for g, group in enumerate(opt.param_groups):
            counts = {int(opt.state[p]["step"]) for p in group["params"] if "step" in opt.state.get(p, {})}
            self.steps[g] = max(counts, default=0)
        for bucket, piece, master in opt.pieces:
            flat = self.buckets[bucket]
            window = slice(piece.shard_start, piece.shard_start + piece.numel)
            state = opt.state.setdefault(master, {})
            for key in ("exp_avg", "exp_avg_sq"):
                view = flat[key][window]
                if key in state and state[key] is not view:
                    view.copy_(state[key].reshape(-1))
                state[key] = view

    def write_steps(self) -> None:
        """Put the step counts where torch keeps them (per parameter), for state dicts."""
        opt = self.opt
        for g, group in enumerate(opt.param_groups):
            if self.steps[g]:
                for p in group["params"]:
                    opt.state[p]["step"] = torch.tensor(float(self.steps[g]))

    def table(self, device: torch.device) -> torch.Tensor:
        """Per group: (1 - lr * wd, beta1, beta2, eps, lr / bias_correction1, sqrt(bias_correction2))."""
        rows = []
        for g, group in enumerate(self.opt.param_groups):
            step = self.steps[g]
            beta1, beta2 = group["betas"]
            lr = float(group["lr"])
            rows.append([1.0 - lr * group["weight_decay"], beta1, beta2, group["eps"],
                         lr / (1.0 - beta1**step), math.sqrt(1.0 - beta2**step), 0.0, 0.0])  # fmt: skip
        return torch.tensor(rows, dtype=torch.float32).to(device, non_blocking=True)

    @torch.no_grad()
    def step(self, coef: torch.Tensor | None) -> None:
        """One AdamW step of every bucket; gradients are multiplied by `coef` (the clipping) as they are read."""
        self.steps = [s + 1 for s in self.steps]
        table = self.table(self.opt.masters[0].device)
        run = _triton_step if self.kernel == "triton" else _torch_step
        for flat in self.buckets:
            run(flat, table, coef)


def _torch_step(flat: dict[str, Any], table: torch.Tensor, coef: torch.Tensor | None) -> None:
    """The kernel's arithmetic in torch ops (torch AdamW's order of operations)."""
    ids = flat["group_ids"].long()
    live = ids != PADDING
    rows = table[ids.clamp(max=table.shape[0] - 1)]
    decay, beta1, beta2, eps, step_size, bc2 = rows[:, :6].unbind(dim=1)
    p, m, v = flat["master"], flat["exp_avg"], flat["exp_avg_sq"]
    g = flat["grad"] if coef is None else flat["grad"] * coef
    new_p = p * decay
    new_m = m.lerp(g, 1 - beta1)
    new_v = v * beta2 + (1 - beta2) * g * g
    new_p = new_p - step_size * new_m / (new_v.sqrt() / bc2 + eps)
    for target, value in ((p, new_p), (m, new_m), (v, new_v)):
        target.copy_(torch.where(live, value, target))
    if flat["out"] is not None:
        flat["out"].copy_(torch.where(live, p.to(flat["out"].dtype), flat["out"]))


def _triton_step(flat: dict[str, Any], table: torch.Tensor, coef: torch.Tensor | None) -> None:
    from ._flat_adamw_kernel import adamw_flat

    adamw_flat(flat["master"], flat["grad"], flat["exp_avg"], flat["exp_avg_sq"], flat["out"],
               flat["group_ids"], table, coef)  # fmt: skip
