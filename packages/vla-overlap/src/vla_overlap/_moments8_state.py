"""State dicts of DistributedAdamW with 8-bit moments, in the format of fp32 runs (_state: full fp32 moments per
parameter name, loadable at any world size, by runs with either kind of moments).

Saving decodes each bucket's moments on its device, one bucket at a time, and hands them to the state dict's
gather as host tensors in the inner AdamW's state for the time of the gather: the device never holds the fp32
moments of more than one bucket. Loading encodes the saved moments bucket by bucket from the state dict's own
tensors; they never enter the inner AdamW's state, whose load_state_dict would move all of them to the device at
once (13 GB for n1.6-3b). The codec is idempotent (_moments8), so a run resumed at the same world size and bucket
layout continues bit for bit; at another layout the quantization blocks group other elements, and the loaded
moments are rounded to the new blocks once.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import torch

from ._moments8 import allocate, decode_moment, encode_moment_
from ._state import scatter_state_dict

if TYPE_CHECKING:
    from ._flat_adamw import FlatAdamW
    from ._optimizer import DistributedAdamW

MOMENTS = ("exp_avg", "exp_avg_sq")


def _window(piece: Any) -> slice:
    return slice(piece.shard_start, piece.shard_start + piece.numel)


@contextlib.contextmanager
def moments_in_state(flat: FlatAdamW) -> Iterator[None]:
    """For the time of the block: the decoded fp32 moments of every piece in the inner AdamW's state, on the
    host (what _state.gather_state_dict reads). Nothing when the moments were never allocated (no step yet)."""
    opt = flat.opt
    added, created = [], []
    try:
        if flat.buckets[0]["exp_avg"] is not None:
            for bucket, moments in enumerate(flat.buckets):
                whole = slice(0, moments["master"].numel())
                decoded = {key: decode_moment(moments, key, whole).cpu() for key in MOMENTS}
                for b, piece, master in opt.pieces:
                    if b == bucket:
                        if master not in opt.state:
                            created.append(master)
                        state = opt.state.setdefault(master, {})
                        state.update({key: values[_window(piece)] for key, values in decoded.items()})
                        added.append(master)
        yield
    finally:
        for master in added:
            for key in MOMENTS:
                opt.state[master].pop(key, None)
        for master in created:
            if not opt.state[master]:
                del opt.state[master]


def load_state_dict8(opt: DistributedAdamW, state_dict: dict[str, Any]) -> None:
    """DistributedAdamW.load_state_dict's part with 8-bit moments: masters, groups and step counts as
    _state.scatter_state_dict loads them, the moments encoded into the flat buckets (zero for parameters saved
    without a step count, as in fp32 runs)."""
    flat = opt.flat
    saved = state_dict.get("state", {})
    # masters and groups through the common loader (it checks the state dict), moments and steps kept apart
    masters_only = {name: {k: v for k, v in entry.items() if k == "master"} for name, entry in saved.items()}
    scatter_state_dict(opt, {**state_dict, "state": masters_only})
    opt._share_inner_groups()  # the inner load_state_dict replaced its state and groups
    names = opt._model.layout.slots
    for _, piece, master in opt.pieces:
        entry = saved[names[piece.slot].name]
        if "step" in entry:
            opt.state[master] = {"step": entry["step"].detach().clone().float()}
    stepped = any("step" in saved[names[piece.slot].name] for _, piece, _ in opt.pieces)
    if not stepped and flat.buckets[0]["exp_avg"] is None:
        return  # nothing to load: allocated at the first step
    with torch.no_grad():
        for bucket, moments in enumerate(flat.buckets):
            if moments["exp_avg"] is None:
                allocate(moments)
            whole = slice(0, moments["master"].numel())
            for key in MOMENTS:
                values = torch.zeros_like(moments["master"])  # padding and parameters without moments: zero
                for b, piece, _ in opt.pieces:
                    entry = saved[names[piece.slot].name]
                    if b == bucket and "step" in entry:
                        values[_window(piece)] = entry[key].reshape(-1)[piece.param_start : piece.param_end]
                encode_moment_(moments, key, whole, values)
