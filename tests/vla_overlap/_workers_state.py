"""Workers of test_state_on_device: DistributedAdamW.state_dict left on the device, or handed to `keep`."""

from __future__ import annotations

from typing import Any

import torch
from _workers_common import ADAMW, make_model, make_scheduler, param_groups, run_steps
from vla_overlap import DistributedAdamW, OverlapConfig, OverlapDataParallel


def _entries(state: dict[str, Any]) -> dict[tuple[str, str], Any]:
    return {(name, key): value for name, entry in state["state"].items() for key, value in entry.items()}


def state_on_device(ctx: Any, flat: str | None, steps: int = 2) -> dict[str, Any]:
    """After `steps` steps: the CPU state dict, the on-device one (and what it holds after one more step),
    the one made through `keep`, and whether each on-device entry aliases the optimizer's own buffers."""
    module = make_model()
    model = OverlapDataParallel(module, OverlapConfig(bucket_elements=600), process_group=ctx.group)
    opt = DistributedAdamW(model, param_groups(module), **ADAMW, flat=flat)
    sched = make_scheduler(opt)
    run_steps(ctx, model, opt, sched, range(steps), 2)
    on_cpu = opt.state_dict()
    on_device = opt.state_dict(on_device=True)
    kept: list[torch.Tensor] = []
    through_keep = opt.state_dict(keep=lambda t: kept.append(t.clone()) or ("kept", len(kept) - 1))
    live = {t.untyped_storage().data_ptr() for t in opt.masters}
    live |= {v.untyped_storage().data_ptr() for s in opt.state.values() for v in s.values() if v.dim()}
    snapshot = {k: v.clone() for k, v in _entries(on_device).items()}
    run_steps(ctx, model, opt, sched, range(steps, steps + 1), 2)
    return {
        "on_cpu": _entries(on_cpu),
        "on_device": snapshot,
        "after_a_step": {k: v.clone() for k, v in _entries(on_device).items()},
        "aliases": {k: v.untyped_storage().data_ptr() in live for k, v in _entries(on_device).items()},
        "own_storage": all(
            v.untyped_storage().nbytes() == v.numel() * v.element_size() for v in _entries(on_cpu).values()
        ),
        "through_keep": {
            k: kept[v[1]] if isinstance(v, tuple) else v for k, v in _entries(through_keep).items()
        },
        "groups_equal": on_cpu["param_groups"] == on_device["param_groups"] == through_keep["param_groups"],
        # at one rank the state's masters are the live pieces: the same addresses, in masters_in_order's order
        "masters_in_order": [m.data_ptr() for m in opt.masters_in_order],
        "state_masters": [entry["master"].data_ptr() for entry in on_device["state"].values()],
        "param_groups_order": [p.data_ptr() for group in opt.param_groups for p in group["params"]],
    }
