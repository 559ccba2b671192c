"""State dicts of DistributedAdamW with 8-bit moments, in the format of fp32 runs (_state: full fp32 moments per
parameter name, loadable at any world size, by runs with either kind of moments).

Saving decodes each bucket's moments on its device, one bucket at a time, and hands them to the state dict's
gather as host tensors in the inner AdamW's state for the time of the gather: the device never holds the fp32
moments of more than one bucket. Loading encodes the saved moments bucket by bucket from the state dict's own
tensors; they never enter the inner AdamW's state, whose load_state_dict would move all of them to the device at
once (13 GB for n1.6-3b). The codec is idempotent (_moments8), so a run resumed at the same world size and bucket
layout continues bit for bit; at another layout the quantization blocks group other elements, and the loaded
moments are rounded to the new blocks once.

A caller that copies the state out itself (`state_dict(encoded_moments=True)`, a checkpoint staged beside training)
gets each moment as it is stored instead: its codes and block scales (`stored_moment`, 2.125 bytes per element
instead of 8, nothing decoded while the loop waits), and `decode_moments` turns them into the fp32 format later,
on whatever device they were copied to. At one rank they are views of the live buffers; at more, every rank's
codes and scales are gathered as they are (each shard is whole blocks): 2.125 bytes per element of both moments
where decoded fp32 ones would move 8, and each parameter's entry is cut out of the gathered bucket. The codec's decode is one
fp32 multiply per element (and one more for exp_avg_sq = w * w), which rounds the same on every device and
depends on nothing but the element's code and its block's scale: the decoded moments are those of
`state_dict()`, bit for bit, at any world size.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

import torch

from ._moments8 import QBLOCK, allocate, decode_m, decode_moment, decode_w, encode_moment_
from ._state import gather_state_dict, scatter_state_dict

if TYPE_CHECKING:
    from ._flat_adamw import FlatAdamW
    from ._optimizer import DistributedAdamW

MOMENTS = ("exp_avg", "exp_avg_sq")
ENCODED = "vla_overlap.moment8/1"
"""The `format` of a moment staged as it is stored (`stored_moment`)."""


def encodable(opt: DistributedAdamW) -> bool:
    """Whether every parameter's moments can be cut out of its bucket as whole blocks: each rank's shard and each
    parameter's place in its bucket start at a quantization block. A property of the layout (shards have the
    same length on every rank), so every rank gets the same answer."""
    layout = opt._model.layout
    stepped = {slot for slots in opt.group_slots for slot in slots}
    return all(
        opt.masters[bucket].numel() % QBLOCK == 0
        and all((layout.slots[s].start - spec.start) % QBLOCK == 0 for s in spec.slots if s in stepped)
        for bucket, spec in enumerate(layout.buckets)
    )


def _all_gathered(opt: DistributedAdamW, shard: torch.Tensor) -> torch.Tensor:
    """Every rank's `shard`, concatenated in rank order (a collective)."""
    full = torch.empty(shard.numel() * opt._comm.size, dtype=shard.dtype, device=shard.device)
    opt._comm.all_gather(full, shard).wait()
    return full


def stored_moment(
    opt: DistributedAdamW, bucket: int, key: str
) -> Callable[[int, int, torch.Size], dict[str, Any]]:
    """Moment `key` of `bucket` as stored (at more than one rank: every rank's codes and scales gathered, 2.125
    bytes per element of both moments instead of fp32's 8), and the cut that makes a parameter's entry of it:
    views of its codes (whole blocks: the last one's tail is padding) and of its blocks' scales, with the shape
    `decode_moments` gives it back. The shards are block-aligned, so the gathered codes are the bucket's blocks
    in order, each with its own scale."""
    moments = opt.flat.buckets[bucket]
    codes, scales = moments[key], moments[f"{key}_scale"]
    if opt._comm.size > 1:
        codes, scales = _all_gathered(opt, codes), _all_gathered(opt, scales)

    def cut(offset: int, numel: int, shape: torch.Size) -> dict[str, Any]:
        end = offset + -(-numel // QBLOCK) * QBLOCK
        return {
            "format": ENCODED,
            "codes": codes[offset:end],
            "scales": scales[offset // QBLOCK : end // QBLOCK],
            "shape": list(shape),
        }

    return cut


def encoded_state_dict(
    opt: DistributedAdamW, *, on_device: bool = False, keep: Callable[[torch.Tensor], Any] | None = None
) -> dict[str, Any] | None:
    """`gather_state_dict(opt, on_device=..., keep=...)` with every moment as stored (`stored_moment`), or None
    where that cannot be (no moments yet, a parameter not block-aligned): the caller decodes then. The same
    answer on every rank, so the collectives match."""
    if opt.flat.buckets[0]["exp_avg"] is None or not encodable(opt):
        return None
    return gather_state_dict(
        opt, on_device=on_device, keep=keep, moments=functools.partial(stored_moment, opt)
    )


def decode_moments(state_dict: dict[str, Any]) -> dict[str, Any]:
    """Replace every moment of `state_dict` staged as stored (`stored_moment`) by its fp32 values, on the device
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
