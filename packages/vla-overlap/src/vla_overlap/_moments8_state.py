"""State dicts of DistributedAdamW with 8-bit moments, in the format of fp32 runs (_state: full fp32 moments per
parameter name, loadable at any world size, by runs with either kind of moments).

Saving decodes each bucket's moments on its device, one bucket at a time, and hands them to the state dict's
gather as host tensors in the inner AdamW's state for the time of the gather: the device never holds the fp32
moments of more than one bucket. Loading encodes the saved moments bucket by bucket from the state dict's own
tensors; they never enter the inner AdamW's state, whose load_state_dict would move all of them to the device at
once (13 GB for n1.6-3b). The codec is idempotent (_moments8), so a run resumed at the same world size and bucket
layout continues bit for bit; at another layout the quantization blocks group other elements, and the loaded
moments are rounded to the new blocks once.

A caller that copies the state out itself (`state_dict(on_device=True, encoded_moments=True)` at one rank, a
checkpoint staged beside training) gets each moment as it is stored instead: its codes and block scales on the
device (`encoded_entry`, 2.125 bytes per element instead of 8, nothing decoded while the loop waits), and
`decode_moments` turns them into the fp32 format later, on whatever device they were copied to. The codec's
decode is one fp32 multiply per element (and one more for exp_avg_sq = w * w), which rounds the same on every
device: the decoded moments are those of `state_dict()`, bit for bit.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import torch

from ._moments8 import QBLOCK, allocate, decode_m, decode_moment, decode_w, encode_moment_
from ._state import gather_state_dict, scatter_state_dict, whole_at_one_rank

if TYPE_CHECKING:
    from ._flat_adamw import FlatAdamW
    from ._optimizer import DistributedAdamW

MOMENTS = ("exp_avg", "exp_avg_sq")
ENCODED = "vla_overlap.moment8/1"
"""The `format` of a moment staged as it is stored (`encoded_entry`)."""


def encodable(opt: DistributedAdamW) -> bool:
    """Whether every piece starts at a quantization block, so its moments can be cut out as whole blocks."""
    return all(piece.shard_start % QBLOCK == 0 for _, piece, _ in opt.pieces)


def encoded_entry(flat: FlatAdamW, bucket: int, piece: Any, key: str, shape: torch.Size) -> dict[str, Any]:
    """Moment `key` of one piece as stored: views of its codes (whole blocks: the last one's tail is padding)
    and of its blocks' scales in the bucket's buffers, with the shape `decode_moments` gives it back."""
    moments = flat.buckets[bucket]
    start = piece.shard_start
    end = start + -(-piece.numel // QBLOCK) * QBLOCK
    return {
        "format": ENCODED,
        "codes": moments[key][start:end],
        "scales": moments[f"{key}_scale"][start // QBLOCK : end // QBLOCK],
        "shape": list(shape),
    }


def encoded_state_dict(opt: DistributedAdamW) -> dict[str, Any] | None:
    """`state_dict(on_device=True)` with every moment as stored (`encoded_entry`), or None where that cannot be
    (more than one rank, a piece not whole or not block-aligned, no moments yet): the caller decodes then."""
    flat = opt.flat
    if opt._comm.size != 1 or flat.buckets[0]["exp_avg"] is None:
        return None
    if not whole_at_one_rank(opt) or not encodable(opt):
        return None
    return gather_state_dict(opt, on_device=True, moment_entry=functools.partial(encoded_entry, flat))


def decode_moments(state_dict: dict[str, Any]) -> dict[str, Any]:
    """Replace every moment of `state_dict` staged as stored (`encoded_entry`) by its fp32 values, on the device
    its codes are on (in place; returns `state_dict`): the format of `state_dict()`, loadable anywhere."""
    for entry in state_dict.get("state", {}).values():
        for key in MOMENTS:
            value = entry.get(key)
            if isinstance(value, dict) and value.get("format") == ENCODED:
                numel = 1
                for size in value["shape"]:
                    numel *= size
                if key == "exp_avg":
                    decoded = decode_m(value["codes"], value["scales"])
                else:
                    w = decode_w(value["codes"], value["scales"])
                    decoded = w * w  # as decode_moment: exp_avg_sq is w squared
                entry[key] = decoded[:numel].view(value["shape"]).clone()  # a storage of its own
    return state_dict


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
