"""World-size independent checkpoints of DistributedAdamW: full per-parameter tensors keyed by name.

Saving all-gathers every bucket's shard of the fp32 master weights and of each AdamW moment, then cuts
the gathered bucket back into parameters; loading cuts each saved parameter into this rank's pieces. The
format knows nothing of buckets, padding or world size, so it reloads under any of them.

At one rank nothing is gathered: each parameter's entries are views of the live master and moment buffers.
`on_device=True` returns them as they are (or, at more ranks, views of the gathered buckets), for a caller
that copies them out itself, beside training (a checkpoint written in the background); the default copies
every entry to its own CPU tensor. `keep` receives each gathered entry as soon as its bucket is gathered, so the
gathered buckets need not all be on the device at once. 8-bit moments may be gathered as they are stored, codes
and block scales (`moments`, from _moments8_state), and decoded by the caller later.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import torch
import torch.distributed as dist

if TYPE_CHECKING:
    from ._optimizer import DistributedAdamW

FORMAT = "vla_overlap.DistributedAdamW/1"


def _moment_keys(opt: DistributedAdamW) -> list[str]:
    keys = ["exp_avg", "exp_avg_sq"]
    if any(group.get("amsgrad", False) for group in opt.param_groups):
        keys.append("max_exp_avg_sq")
    return keys


def _optimizer_slots(opt: DistributedAdamW) -> list[int]:
    return [slot for slots in opt.group_slots for slot in slots]


def _local_steps(opt: DistributedAdamW, position: dict[int, int], device: torch.device) -> torch.Tensor:
    """Step count of every optimizer parameter, agreed over ranks (-1: no state yet)."""
    steps = torch.full((len(position),), -1.0, dtype=torch.float64)
    for _, piece, master in opt.pieces:
        state = opt.state.get(master, {})
        if "step" in state:
            steps[position[piece.slot]] = float(state["step"])
    if opt._comm.size == 1:  # no device round trip (it would wait for the device)
        return steps
    steps = steps.to(device)
    opt._comm.all_reduce_now(steps, dist.ReduceOp.MAX)
    return steps.cpu()


def _gather_bucket(opt: DistributedAdamW, bucket: int, key: str) -> torch.Tensor:
    """The whole bucket's fp32 values of `key` ('master' or a moment), assembled from every rank's shard."""
    master = opt.masters[bucket]
    if key == "master":
        shard = master  # read by the gather only
    else:
        shard = torch.zeros_like(master)
        for piece_bucket, piece, piece_master in opt.pieces:
            state = opt.state.get(piece_master, {})
            if piece_bucket == bucket and key in state:
                shard[piece.shard_start : piece.shard_start + piece.numel] = state[key]
    full = torch.empty(shard.numel() * opt._comm.size, dtype=shard.dtype, device=shard.device)
    opt._comm.all_gather(full, shard).wait()
    return full


def _to_cpu(tensor: torch.Tensor) -> torch.Tensor:
    return tensor.to("cpu", copy=True)  # its own storage, whatever the device


def whole_at_one_rank(opt: DistributedAdamW) -> bool:
    """Whether every stepped parameter is one piece of this rank's shard (one rank: nothing to gather)."""
    layout = opt._model.layout
    return opt._comm.size == 1 and all(
        piece.param_start == 0 and piece.numel == layout.slots[piece.slot].numel for _, piece, _ in opt.pieces
    )


def gather_state_dict(
    opt: DistributedAdamW,
    *,
    on_device: bool = False,
    keep: Callable[[torch.Tensor], Any] | None = None,
    moments: Callable[[int, str], Callable[[int, int, torch.Size], dict[str, Any]]] | None = None,
) -> dict[str, Any]:
    """The full, per-parameter state (a collective at more than one rank). Entries are CPU copies; with
    `on_device`, device tensors that alias the optimizer's buffers at one rank (copy them before the next
    step changes them) and views of the gathered buckets at more; `keep` maps each such entry, as soon as it
    exists, to what the state holds instead. `moments(bucket, key)` (8-bit moments staged as stored) replaces
    the inner AdamW's moments: called once per bucket and moment, on every rank in the same order (it may
    gather), it returns `cut(offset, numel, shape)`, the entry of the parameter at `offset` of the whole
    bucket (at one rank: of the shard), a dict whose tensors go through `keep` like any entry."""
    layout = opt._model.layout
    slots = _optimizer_slots(opt)
    position = {slot: i for i, slot in enumerate(slots)}
    steps = _local_steps(opt, position, opt.masters[0].device)
    shapes = {i: p.shape for i, p in enumerate(opt._model._params)}
    keys = ["master"] + (_moment_keys(opt) if bool((steps >= 0).any()) else [])
    state: dict[str, dict[str, Any]] = {layout.slots[s].name: {} for s in slots}
    finish = keep or ((lambda t: t) if on_device else _to_cpu)

    def finished(entry: dict[str, Any]) -> dict[str, Any]:
        return {k: finish(v) if isinstance(v, torch.Tensor) else v for k, v in entry.items()}

    if whole_at_one_rank(opt):
        cuts = {}  # (bucket, key) -> cut: views of the live buffers, nothing gathered
        for bucket, piece, master in opt.pieces:
            entry, saved = state[layout.slots[piece.slot].name], opt.state.get(master, {})
            for key in keys:
                if key != "master" and steps[position[piece.slot]] < 0:
                    continue
                if key != "master" and moments is not None:
                    if (bucket, key) not in cuts:
                        cuts[bucket, key] = moments(bucket, key)
                    entry[key] = finished(
                        cuts[bucket, key](piece.shard_start, piece.numel, shapes[piece.slot])
                    )
                    continue
                live = master if key == "master" else saved.get(key)
                live = torch.zeros_like(master) if live is None else live  # made only where it is missing
                entry[key] = finish(live.view(shapes[piece.slot]))
    else:
        for bucket, spec in enumerate(layout.buckets):
            members = [s for s in spec.slots if s in position]
            if not members:
                continue
            for key in keys:
                stored = key != "master" and moments is not None
                full = moments(bucket, key) if stored else _gather_bucket(opt, bucket, key)
                for slot in members:
                    if key != "master" and steps[position[slot]] < 0:
                        continue
                    where = layout.slots[slot]
                    offset = where.start - spec.start
                    if stored:
                        state[where.name][key] = finished(full(offset, where.numel, shapes[slot]))
                    else:
                        view = full[offset : offset + where.numel].view(shapes[slot])
                        state[where.name][key] = finish(view)
                del full  # with `keep`, only what it holds stays on the device
    for slot in slots:
        if steps[position[slot]] >= 0:
            state[layout.slots[slot].name]["step"] = torch.tensor(
                float(steps[position[slot]]), dtype=torch.float32
            )
    groups = [
        {k: v for k, v in group.items() if k != "params"}
        | {"params": [layout.slots[s].name for s in group_slots]}
        for group, group_slots in zip(opt.param_groups, opt.group_slots)
    ]
    return {"format": FORMAT, "state": state, "param_groups": groups}


def _check_compatible(opt: DistributedAdamW, state_dict: dict[str, Any]) -> None:
    if state_dict.get("format") != FORMAT:
        raise ValueError(
            f"not a DistributedAdamW state dict: format is {state_dict.get('format')!r}, expected {FORMAT!r}"
        )
    names = opt._model.layout.slots
    ours = [[names[s].name for s in slots] for slots in opt.group_slots]
    saved = [list(group["params"]) for group in state_dict["param_groups"]]
    if len(saved) != len(ours):
        raise ValueError(f"state dict has {len(saved)} parameter groups, this optimizer has {len(ours)}")
    for index, (a, b) in enumerate(zip(saved, ours)):
        if a != b:
            extra, missing = sorted(set(a) - set(b)), sorted(set(b) - set(a))
            raise ValueError(
                f"param_groups[{index}] differs from the saved one: saved-only {extra[:5]}, missing {missing[:5]}"
                + ("" if extra or missing else " (same names, different order)")
            )
    absent = [name for group in ours for name in group if "master" not in state_dict["state"].get(name, {})]
    if absent:
        raise ValueError(f"state dict has no 'master' entry for {absent[:5]}")


def scatter_state_dict(opt: DistributedAdamW, state_dict: dict[str, Any]) -> None:
    """Cut each saved parameter into this rank's pieces: masters are copied in place, moments and steps
    go through the inner AdamW's own load_state_dict (which places them on the right device and dtype)."""
    _check_compatible(opt, state_dict)
    names = opt._model.layout.slots
    index_of = {
        id(p): i for i, p in enumerate(p for group in opt.inner.param_groups for p in group["params"])
    }
    inner_state: dict[int, dict[str, torch.Tensor]] = {}
    moment_keys = _moment_keys(opt)
    with torch.no_grad():
        for _, piece, master in opt.pieces:
            saved = state_dict["state"][names[piece.slot].name]
            window = slice(piece.param_start, piece.param_end)
            master.copy_(saved["master"].reshape(-1)[window])
            if "step" in saved:
                entry = {"step": saved["step"].detach().clone().float()}
                for key in moment_keys:
                    entry[key] = saved[key].reshape(-1)[window].clone()
                inner_state[index_of[id(master)]] = entry
    groups = []
    for saved, live in zip(state_dict["param_groups"], opt.inner.param_groups):
        group = {k: v for k, v in saved.items() if k != "params"}
        groups.append(group | {"params": [index_of[id(p)] for p in live["params"]]})
    opt.inner.load_state_dict({"state": inner_state, "param_groups": groups})
