"""Workers of test_moments8_step: DistributedAdamW(moments="int8") against torch's AdamW, across world sizes and
across a save and resume."""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from _workers_common import ADAMW, bf16_model, make_scheduler, param_groups, params_of, run_steps
from torch import nn
from vla_overlap import DistributedAdamW, OverlapConfig, OverlapDataParallel
from vla_overlap._moments8 import QBLOCK, decode_moment

ADAMW8 = {**ADAMW, "betas": (0.9, 0.999), "lr": 3e-3, "flat": "torch", "moments": "int8"}


def _regression(seed: int = 0) -> nn.Module:
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(16, 64), nn.GELU(), nn.Linear(64, 64), nn.GELU(), nn.Linear(64, 4))


def _data(step: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(step)
    x = torch.randn(64, 16, generator=g)
    return x, torch.sin(x[:, :4] * 2) + 0.1 * torch.randn(64, 4, generator=g)


def _decoded(opt: DistributedAdamW) -> list[dict[str, torch.Tensor]]:
    """Every bucket's moments, decoded: exp_avg and w = sqrt(exp_avg_sq), plus their per-element block maxima."""
    out = []
    for flat in opt.flat.buckets:
        whole = slice(0, flat["master"].numel())
        m, v = decode_moment(flat, "exp_avg", whole), decode_moment(flat, "exp_avg_sq", whole)
        out.append({"m": m, "w": v.sqrt(), "am": flat["exp_avg_scale"].repeat_interleave(QBLOCK),
                    "aw": flat["exp_avg_sq_scale"].repeat_interleave(QBLOCK)})  # fmt: skip
    return out


def moments8_shadow(ctx: Any, steps: int = 50) -> dict[str, Any]:
    """50 steps of the int8 flat step on a small regression. Before each, torch's AdamW (single-tensor) is given
    the same masters, gradients and decoded moments as a shadow, and stepped once: per step, the masters after
    both and the shadow's new moments next to the int8 run's decoded ones (with their block maxima). Then the
    whole int8 trajectory next to a plain torch AdamW run (fp32 moments), and their losses."""
    module = _regression()
    start = torch.cat([p.detach().flatten().clone() for p in module.parameters()])
    model = OverlapDataParallel(module, OverlapConfig(bucket_elements=None), process_group=ctx.group)
    opt = DistributedAdamW(model, **ADAMW8)
    reference = _regression()
    plain = torch.optim.AdamW(
        reference.parameters(), **{k: v for k, v in ADAMW8.items() if k not in ("flat", "moments")}
    )
    records, losses = [], {"int8": [], "fp32": []}
    for step in range(steps):
        x, y = _data(step)
        model.zero_grad()
        loss = F.mse_loss(model(x), y)
        loss.backward()
        losses["int8"].append(float(loss.detach()))
        plain.zero_grad()
        ref_loss = F.mse_loss(reference(x), y)
        ref_loss.backward()
        plain.step()
        losses["fp32"].append(float(ref_loss.detach()))
        opt._prepare_grads()
        (flat,) = opt.flat.buckets
        shadow = torch.nn.Parameter(flat["master"].clone())
        shadow.grad = flat["grad"].clone()
        inner = torch.optim.AdamW(
            [shadow], **{k: v for k, v in ADAMW8.items() if k not in ("flat", "moments")}
        )
        if step:
            (before,) = _decoded(opt)
            inner.state[shadow] = {"step": torch.tensor(float(step)), "exp_avg": before["m"].clone(),
                                   "exp_avg_sq": (before["w"] ** 2).clone()}  # fmt: skip
        inner.step()
        opt.step()
        (after,) = _decoded(opt)
        state = inner.state[shadow]
        records.append({"master": flat["master"].clone(), "shadow": shadow.detach().clone(),
                        "m_ref": state["exp_avg"].clone(), "w_ref": state["exp_avg_sq"].sqrt(), **after})  # fmt: skip
    model.finish_param_sync()
    ours = torch.cat([p.detach().flatten() for p in module.parameters()])
    theirs = torch.cat([p.detach().flatten() for p in reference.parameters()])
    return {
        "records": records,
        "losses": losses,
        "start": start,
        "int8": ours.clone(),
        "fp32": theirs.clone(),
    }


def moments8_same_data(ctx: Any, steps: int = 5) -> dict[str, Any]:
    """Every rank trains on the same full batch (so the mean gradient equals one rank's, exactly), one bucket
    (so the quantization blocks group the same elements at any world size), clipping computed but inactive."""
    module = _regression()
    model = OverlapDataParallel(module, OverlapConfig(bucket_elements=None), process_group=ctx.group)
    opt = DistributedAdamW(model, param_groups(module), **ADAMW8)
    for step in range(steps):
        x, y = _data(step)
        model.zero_grad()
        F.mse_loss(model(x), y).backward()
        opt.clip_grad_norm_(1e3)
        opt.step()
    return {"params": params_of(module), "state": opt.state_dict()}


def _entries(state: dict[str, Any]) -> dict[tuple[str, str], torch.Tensor]:
    return {(name, key): value for name, entry in state["state"].items() for key, value in entry.items()}


def moments8_resume(ctx: Any, steps: int = 4) -> dict[str, Any]:
    """bf16 parameters with an fp32 head (two buffers), several buckets, masters as remainders, autocast and
    clipping: 4 steps straight, and 2 steps saved and resumed in a fresh run for 2 more. Also: a state dict loaded
    and saved again; an int8 state dict continued by an fp32-moment run and the other way round."""

    def train(steps: range, state=None, moments: str = "int8") -> dict[str, Any]:
        module = bf16_model(mixed=True)
        model = OverlapDataParallel(module, OverlapConfig(bucket_elements=600), process_group=ctx.group)
        opt = DistributedAdamW(
            model, param_groups(module), **{**ADAMW8, "remainders": True, "moments": moments}
        )
        sched = make_scheduler(opt)
        if state is not None:
            module.load_state_dict(state["model"])
            opt.load_state_dict(state["optim"])
            sched.load_state_dict(state["sched"])
        norms = run_steps(ctx, model, opt, sched, steps, 1, autocast=True, clip=0.05, dtype=torch.bfloat16)
        flats = opt.flat.buckets
        buffers = [f[k].clone() for f in flats for k in ("exp_avg", "exp_avg_sq", "exp_avg_scale", "exp_avg_sq_scale")
                   if f.get(k) is not None]  # fmt: skip
        saved = {"model": {k: v.clone() for k, v in module.state_dict().items()}, "optim": opt.state_dict(),
                 "sched": sched.state_dict()}  # fmt: skip
        return {"params": params_of(module), "norms": norms, "buffers": buffers, "state": saved, "opt": opt}

    straight = train(range(steps))
    resumed = train(range(2, steps), state=train(range(2))["state"])
    reloaded = train(range(0), state=straight["state"])  # load, no step, save again
    into_fp32 = train(range(0), state=straight["state"], moments="fp32")
    from_fp32 = train(range(0), state=train(range(2), moments="fp32")["state"])
    return {
        "straight": {k: straight[k] for k in ("params", "norms", "buffers")},
        "resumed": {k: resumed[k] for k in ("params", "norms", "buffers")},
        "saved": _entries(straight["state"]["optim"]),
        "saved_again": _entries(reloaded["state"]["optim"]),
        "into_fp32": _entries(into_fp32["state"]["optim"]),
        "from_fp32_moved": bool(any(f["exp_avg"].ne(0).any() for f in from_fp32["opt"].flat.buckets)),
        "on_host": all(v.device.type == "cpu" for v in _entries(straight["state"]["optim"]).values()),
        "inner_state_keys": sorted({k for s in straight["opt"].state.values() for k in s}),
    }


def moments8_refusals(ctx: Any) -> dict[str, Any]:
    """Wrong `moments` values and the 8-bit moments without the flat step are refused; "auto" off CUDA runs
    the torch form."""
    out = {}
    module = _regression()
    model = OverlapDataParallel(module, OverlapConfig(), process_group=ctx.group)
    for name, kwargs in (("int4", {"moments": "int4"}), ("no_flat", {"moments": "int8", "flat": None}),
                         ("fp64", {"moments": "int8", "flat": "auto"})):  # fmt: skip
        target = model
        if name == "fp64":
            target = OverlapDataParallel(_regression().double(), OverlapConfig(grad_reduce_dtype=None),
                                         process_group=ctx.group)  # fmt: skip
        try:
            DistributedAdamW(target, **kwargs)
            out[name] = None
        except ValueError as err:
            out[name] = str(err)
    auto = DistributedAdamW(OverlapDataParallel(_regression(), OverlapConfig(), process_group=ctx.group),
                            flat="auto", moments="int8")  # fmt: skip
    out["auto_kernel"] = auto.flat.kernel if not torch.cuda.is_available() else "torch"
    out["moments"] = auto.moments
    return out


def _gathered_bytes(opt: DistributedAdamW, take: Any) -> tuple[Any, int]:
    """(what `take()` returns, bytes its all-gathers received on this rank): the state dict's own gathers (the
    parameters' gather the last step started is finished first)."""
    opt._model.finish_param_sync()
    comm, counted = opt._comm, [0]
    plain = comm.all_gather

    def counting(output: torch.Tensor, input: torch.Tensor) -> Any:
        counted[0] += output.numel() * output.element_size()
        return plain(output, input)

    comm.all_gather = counting
    try:
        return take(), counted[0]
    finally:
        del comm.all_gather  # the class's method again


def moments8_staged_resume(ctx: Any, steps: int = 4) -> dict[str, Any]:
    """At any world size, as a checkpoint staged beside training takes it: 2 steps, `state_dict(on_device=True,
    encoded_moments=True)` copied to fresh CPU tensors (at one rank views of the live buffers; at more, of the
    gathered codes and scales) and `state_dict(keep=..., encoded_moments=True)` as gr00t-train's staging takes it
    at more ranks, one more step (the live buffers move on), then both decoded (`decode_moments`) and compared
    with the decoded state dict taken at the save; a fresh run resumed from it steps twice more, against 4 steps
    straight. Also the bytes each state dict's all-gathers received."""
    from vla_overlap import decode_moments
    from vla_overlap._moments8_state import ENCODED

    def build() -> tuple[nn.Module, Any, DistributedAdamW, Any]:
        module = bf16_model(mixed=True)
        model = OverlapDataParallel(module, OverlapConfig(bucket_elements=600), process_group=ctx.group)
        opt = DistributedAdamW(model, param_groups(module), **{**ADAMW8, "remainders": True})
        return module, model, opt, make_scheduler(opt)

    def run(parts, span: range) -> list[float]:
        _, model, opt, sched = parts
        return run_steps(ctx, model, opt, sched, span, 1, autocast=True, clip=0.05, dtype=torch.bfloat16)

    def copy_out(node: Any) -> Any:  # what Staging does with the tree: every tensor into a storage of its own
        if isinstance(node, torch.Tensor):
            return node.detach().to("cpu", copy=True)
        if isinstance(node, dict):
            return {key: copy_out(value) for key, value in node.items()}
        if isinstance(node, list):
            return [copy_out(value) for value in node]
        return node

    straight = build()
    norms = run(straight, range(steps))
    saving = build()
    run(saving, range(2))
    module, _, opt, sched = saving
    encoded, encoded_bytes = _gathered_bytes(
        opt, lambda: opt.state_dict(on_device=True, encoded_moments=True)
    )
    kinds = {key: type(value).__name__ for entry in encoded["state"].values() for key, value in entry.items()}
    formats = {v["format"] for e in encoded["state"].values() for v in e.values() if isinstance(v, dict)}
    staged = copy_out(encoded)
    kept = opt.state_dict(keep=lambda t: t.detach().to("cpu", copy=True), encoded_moments=True)
    reference, decoded_bytes = _gathered_bytes(opt, opt.state_dict)
    masters_bytes = sum(m.numel() * 4 for m in opt.masters) * ctx.world_size if ctx.world_size > 1 else 0
    model_state = {k: v.clone() for k, v in module.state_dict().items()}
    sched_state = sched.state_dict()
    run(saving, range(2, 3))  # the live buffers move on; the staged copies keep the save step
    decoded, decoded_kept = decode_moments(staged), decode_moments(kept)
    resumed = build()
    resumed[0].load_state_dict(model_state)
    resumed[2].load_state_dict(decoded)
    resumed[3].load_state_dict(sched_state)
    resumed_norms = run(resumed, range(2, steps))
    return {
        "kinds": kinds,
        "formats": sorted(formats),
        "encoded_format": ENCODED,
        "decoded": _entries(decoded),
        "decoded_kept": _entries(decoded_kept),
        "reference": _entries(reference),
        "gathered": {"encoded": encoded_bytes, "decoded": decoded_bytes, "masters": masters_bytes},
        "split": any(piece.numel < opt._model.layout.slots[piece.slot].numel for _, piece, _ in opt.pieces),
        "norms": norms,
        "resumed_norms": resumed_norms,
        "params": params_of(straight[0]),
        "resumed_params": params_of(resumed[0]),
    }
