"""Worker scenarios of ZeRO-1 optimizer state: checkpoints, weights loaded into a running model, fused
clipping and the flat AdamW step."""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from _workers_common import (
    ADAMW,
    batch,
    bf16_model,
    build,
    make_model,
    make_scheduler,
    param_groups,
    params_of,
    run_steps,
)
from vla_overlap import DistributedAdamW, OverlapConfig, OverlapDataParallel


# ------------------------------------------------------------------------------------------- checkpoints
def checkpoint_save(ctx: Any, save_at: int, steps: int, micro: int = 2) -> dict[str, Any]:
    """Train zero1 for `steps` steps, taking model + optimizer + scheduler state after `save_at`."""
    model, opt, sched, module = build(ctx, "zero1")
    run_steps(ctx, model, opt, sched, range(save_at), micro)
    saved = {"model": params_of(module), "optim": opt.state_dict(), "sched": sched.state_dict()}
    run_steps(ctx, model, opt, sched, range(save_at, steps), micro)
    return {"saved": saved, "final": params_of(module)}


def checkpoint_resume(
    ctx: Any, saved: dict[str, Any], start: int, steps: int, micro: int = 2
) -> dict[str, Any]:
    """Fresh (differently seeded) zero1 run that loads `saved` and continues; also re-saves right after
    loading to prove the round trip is lossless."""
    module = make_model(seed=123)
    model = OverlapDataParallel(module, OverlapConfig(bucket_elements=600), process_group=ctx.group)
    opt = DistributedAdamW(model, param_groups(module), **ADAMW)
    sched = make_scheduler(opt)
    module.load_state_dict(saved["model"])
    opt.load_state_dict(saved["optim"])
    sched.load_state_dict(saved["sched"])
    resaved = opt.state_dict()
    run_steps(ctx, model, opt, sched, range(start, steps), micro)
    return {"resaved": resaved, "final": params_of(module), "lr": opt.param_groups[0]["lr"]}


def load_weights_into_running_zero1(ctx: Any) -> dict[str, bool]:
    """bf16 parameters, lazy gathers pending after a step, then module.load_state_dict(new weights): the
    loaded values must survive state_dict reads, a forward pass and an lr=0 step (stale fp32 masters or
    late gathers would bring the old weights back)."""
    module = make_model(dtype=torch.bfloat16)
    model = OverlapDataParallel(module, OverlapConfig(bucket_elements=600), process_group=ctx.group)
    opt = DistributedAdamW(model, **ADAMW)
    run_steps(ctx, model, opt, make_scheduler(opt), range(1), 2, dtype=torch.bfloat16)
    assert model._gather.pending, "the scenario needs gathers still pending"
    weights = params_of(make_model(seed=7, dtype=torch.bfloat16))
    module.load_state_dict(weights)
    checks = {"after_load": all(torch.equal(v, weights[k]) for k, v in params_of(module).items())}
    x, y = batch(5, 0, ctx.rank, ctx.world_size, torch.bfloat16)
    model(x)
    checks["after_forward"] = all(torch.equal(v, weights[k]) for k, v in params_of(module).items())
    for group in opt.param_groups:
        group["lr"], group["weight_decay"] = 0.0, 0.0
    model.zero_grad()
    F.mse_loss(model(x).float(), y.float()).backward()
    opt.step()
    checks["after_step"] = all(torch.equal(v, weights[k]) for k, v in params_of(module).items())
    return checks


# ------------------------------------------------------------------------------------------- fused clipping
def fused_clip(ctx: Any, steps: int = 3, micro: int = 2) -> dict[str, Any]:
    """DistributedAdamW with global-norm clipping: fused AdamW (the clip folded into its grad_scale, no pass
    over the gradients) vs the single-tensor AdamW (gradients multiplied by the clip coefficient)."""
    out = {}
    for fused in (False, True):
        module = make_model()
        model = OverlapDataParallel(module, OverlapConfig(bucket_elements=600), process_group=ctx.group)
        opt = DistributedAdamW(model, param_groups(module), **{**ADAMW, "foreach": None, "fused": fused})
        norms = run_steps(ctx, model, opt, make_scheduler(opt), range(steps), micro, clip=0.05)
        out[f"fused={fused}"] = {
            "params": params_of(module),
            "norms": norms,
            "scale_left": opt.inner.grad_scale,
        }
    return out


def flat_adamw(ctx: Any, steps: int = 3, micro: int = 2) -> dict[str, Any]:
    """DistributedAdamW's flat one-pass step (torch-op kernel here; the Triton kernel is tested on the GPU)
    vs torch's AdamW, with clipping and two parameter groups, bf16 parameters with fp32 masters; then the
    flat optimizer's state dict loaded into a torch-stepped one continues the same trajectory."""
    out = {}
    for flat in (None, "torch"):
        module = bf16_model(mixed=True)
        model = OverlapDataParallel(module, OverlapConfig(bucket_elements=600), process_group=ctx.group)
        opt = DistributedAdamW(model, param_groups(module), **{**ADAMW, "flat": flat})
        sched = make_scheduler(opt)
        norms = run_steps(
            ctx, model, opt, sched, range(steps), micro, autocast=True, clip=0.05, dtype=torch.bfloat16
        )
        saved = opt.state_dict()
        resumed_module = bf16_model(mixed=True)
        resumed = OverlapDataParallel(
            resumed_module, OverlapConfig(bucket_elements=600), process_group=ctx.group
        )
        other = DistributedAdamW(
            resumed, param_groups(resumed_module), **{**ADAMW, "flat": "torch" if flat is None else None}
        )
        other.load_state_dict(saved)
        other_sched = make_scheduler(other)
        for _ in range(steps):
            other_sched.step()
        run_steps(
            ctx,
            resumed,
            other,
            other_sched,
            range(steps, steps + 2),
            micro,
            autocast=True,
            clip=0.05,
            dtype=torch.bfloat16,
        )
        out[f"flat={flat}"] = {
            "params": params_of(module),
            "norms": norms,
            "resumed": params_of(resumed_module),
            "masters": {name: entry["master"] for name, entry in saved["state"].items()},
            "moments": {name: entry["exp_avg_sq"] for name, entry in saved["state"].items()},
            "steps": [float(entry["step"]) for entry in saved["state"].values()],
        }
    # The flat moments exist from the first step on (as torch's AdamW state does), and a state dict saved
    # before any step, loaded into a stepped optimizer, leaves them zero (a fresh start).
    fresh_module = bf16_model(mixed=True)
    fresh_model = OverlapDataParallel(
        fresh_module, OverlapConfig(bucket_elements=600), process_group=ctx.group
    )
    fresh = DistributedAdamW(fresh_model, param_groups(fresh_module), **{**ADAMW, "flat": "torch"})
    out["lazy_moments"] = all(
        flat[key] is None for flat in fresh.flat.buckets for key in ("exp_avg", "exp_avg_sq")
    )
    out["state_before_step"] = sorted({key for state in fresh.state.values() for key in state})
    opt.load_state_dict(fresh.state_dict())  # opt: the flat one, stepped above
    out["moments_after_fresh_load"] = [
        float(flat[key].abs().sum()) for flat in opt.flat.buckets for key in ("exp_avg", "exp_avg_sq")
    ]
    return out


def narrow_grads(ctx: Any, steps: int = 3) -> dict[str, Any]:
    """The flat step reading bf16 gradient buffers in place (grad_reduce_dtype=None) vs fp32 buffers, at one
    rank and one microbatch (nothing accumulates), bf16 parameters with fp32 masters, with clipping."""
    out = {}
    for dtype in (torch.float32, None):
        module = bf16_model(mixed=True)
        config = OverlapConfig(bucket_elements=600, grad_reduce_dtype=dtype)
        model = OverlapDataParallel(module, config, process_group=ctx.group)
        opt = DistributedAdamW(model, param_groups(module), **{**ADAMW, "flat": "torch"})
        norms = run_steps(ctx, model, opt, make_scheduler(opt), range(steps), 1, autocast=True, clip=0.05,
                          dtype=torch.bfloat16)  # fmt: skip
        out[str(dtype)] = {
            "params": params_of(module),
            "norms": norms,
            "masters": [m.clone() for m in opt.masters],
            "grad_dtypes": sorted({str(g.dtype) for g in opt._grad_shards}),
            "in_place": all(
                g.data_ptr() == model._grads.shard_view(b).data_ptr() for b, g in enumerate(opt._grad_shards)
            ),
        }
    return out


def staged_update(ctx: Any, steps: int = 3) -> dict[str, Any]:
    """The update in stages (DistributedAdamW.stage_update: stage k + 1 = block k, stage 0 the rest), in one
    stage, and not staged, at one rank with clipping; at each stage's mark, a copy of every parameter."""
    out: dict[str, Any] = {}
    for how in ("plain", "one stage", "staged"):
        module = make_model(dtype=torch.bfloat16, d=64)
        model = OverlapDataParallel(module, OverlapConfig(bucket_elements=6000), process_group=ctx.group)
        opt = DistributedAdamW(model, param_groups(module), **{**ADAMW, "flat": "torch"})
        marks: list[tuple[int, dict[str, torch.Tensor]]] = []

        class Fences:  # what stage_update drives on an UpdateStream
            def add_stages(self, count: int) -> None:
                self.count = count

            def mark_stage(self, stage: int, marks=marks, module=module) -> None:
                marks.append((stage, params_of(module)))

        fences = Fences()
        if how != "plain":
            stages = [list(block.parameters()) for block in module.blocks] if how == "staged" else []
            if stages:  # a parameter listed twice (shared) belongs to the first stage that reads it
                stages[-1] += list(module.blocks[0].parameters())
            assert opt.stage_update(stages, fences)
        norms = run_steps(ctx, model, opt, make_scheduler(opt), range(steps), 1, autocast=True, clip=0.05,
                          dtype=torch.bfloat16)  # fmt: skip
        masters = [m.clone() for m in opt.masters]
        out[how] = {"params": params_of(module), "norms": norms, "marks": marks, "masters": masters,
                    "count": getattr(fences, "count", None)}  # fmt: skip
    return out


# --------------------------------------------------------------------------------------------- idle rows
class _Table(torch.nn.Module):
    """A per-category table (rows of 128 elements) feeding a linear layer: a batch touches only its rows."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.table = torch.nn.Parameter(torch.randn(8, 2, 64))
        self.head = torch.nn.Linear(128, 4)
        self.second = torch.nn.Parameter(torch.randn(8, 128))  # tracked first, in the bucket of the head

    def forward(self, rows: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.table[rows].flatten(1) * x + self.second[rows])


def idle_rows(ctx: Any) -> dict[str, Any]:
    """The flat step with a table's untouched rows tracked (track_rows) vs stepped, on the same gradients
    (weight decay whose factor is < 1, and one that rounds to 1 in fp32); then a tracked run saved after two
    steps and resumed with a fresh record of touched rows (all False): its stateful rows must still step."""
    used = [[2, 5], [5, 2], [7, 2], [2, 2]]  # row 7 is touched first at step 2

    def train(track: bool, decay: float, steps: range, state=None) -> dict[str, Any]:
        module = _Table()
        model = OverlapDataParallel(module, OverlapConfig(bucket_elements=1024), process_group=ctx.group)
        opt = DistributedAdamW(model, **{**ADAMW, "weight_decay": decay, "flat": "torch"})
        touched = torch.zeros(8, dtype=torch.bool)
        tracked = [opt.track_rows(p, touched) for p in (module.second, module.table)] if track else None
        if state is not None:
            module.load_state_dict(state["model"])
            opt.load_state_dict(state["optim"])
        idle = []
        for step in steps:
            rows = torch.tensor(used[step])
            touched[rows] = True
            model.zero_grad()
            model(rows, torch.ones(2, 128)).square().sum().backward()
            opt.step()
            if track:  # idle blocks of this step (a row of 128 elements is one block)
                idle.append(sum(int(opt.flat.idle_blocks(flat).sum()) for flat in opt.flat.buckets))
        state = {"model": {k: v.clone() for k, v in module.state_dict().items()}, "optim": opt.state_dict()}
        moments = [
            opt.flat.buckets[b][k].clone() for b in range(len(opt.masters)) for k in ("exp_avg", "exp_avg_sq")
        ]
        return {"params": params_of(module), "masters": [m.clone() for m in opt.masters], "moments": moments,
                "tracked": tracked, "idle": idle, "state": state}  # fmt: skip

    out = {}
    for decay in (0.1, 1e-9):
        out[decay] = {"stepped": train(False, decay, range(4)), "tracked": train(True, decay, range(4))}
    saved = train(True, 0.1, range(2))["state"]
    out["resumed"] = train(True, 0.1, range(2, 4), state=saved)
    module = torch.nn.Linear(3, 3)  # rows of 3 elements: not tracked (they would lose 16-byte accesses)
    opt = DistributedAdamW(
        OverlapDataParallel(module, OverlapConfig(), process_group=ctx.group), flat="torch"
    )
    out["ragged_tracked"] = opt.track_rows(module.weight, torch.zeros(3, dtype=torch.bool))
    try:
        opt.track_rows(module.weight, torch.zeros(4, dtype=torch.bool))
    except ValueError as err:
        out["wrong_record"] = str(err)
    return out


# ------------------------------------------------------------------------------------------- remainders
def remainders(ctx: Any, steps: int = 4) -> dict[str, Any]:
    """The flat step with masters kept as bf16 parameter + 16-bit remainder vs plain fp32 masters (bf16
    parameters, clipping, autocast); then a remainder run saved after two steps and resumed in a fresh one."""

    def train(keep: bool, steps: range, state=None) -> dict[str, Any]:
        module = bf16_model(mixed=True)
        model = OverlapDataParallel(module, OverlapConfig(bucket_elements=600), process_group=ctx.group)
        opt = DistributedAdamW(model, param_groups(module), **{**ADAMW, "flat": "torch", "remainders": keep})
        sched = make_scheduler(opt)
        if state is not None:
            module.load_state_dict(state["model"])
            opt.load_state_dict(state["optim"])
            sched.load_state_dict(state["sched"])
        norms = run_steps(ctx, model, opt, sched, steps, 1, autocast=True, clip=0.05, dtype=torch.bfloat16)
        saved = {"model": {k: v.clone() for k, v in module.state_dict().items()}, "optim": opt.state_dict(),
                 "sched": sched.state_dict()}  # fmt: skip
        kept = [flat for flat in opt.flat.buckets if flat["rem"] is not None]
        return {
            "params": params_of(module),
            "norms": norms,
            "masters": [m.clone() for m in opt.masters],  # decoded by state_dict()
            "kept_buckets": len(kept),
            # the bf16 parameters are always the round-to-nearest-even of the (decoded) masters
            "params_round_masters": all(torch.equal(f["out"], f["master"].to(torch.bfloat16)) for f in kept),
            "state": saved,
        }

    out = {"plain": train(False, range(steps)), "kept": train(True, range(steps))}
    out["resumed"] = train(True, range(2, steps), state=train(True, range(2))["state"])
    out["resumed"].pop("state")
    out["plain"].pop("state")
    out["kept"].pop("state")
    try:
        DistributedAdamW(OverlapDataParallel(bf16_model(mixed=True), OverlapConfig(), process_group=ctx.group),
                         remainders=True)  # fmt: skip
    except ValueError as err:
        out["without_flat"] = str(err)
    return out
