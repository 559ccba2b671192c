"""The data side of a `data.mixture` run: every member opened as its own single-dataset run would open it
(`data.dataset`: features, joint groups, statistics, held-out split, embodiment spec, processor), then put behind
one vla_io.MixtureDataset.

Where the work happens:
- L1 (the pipeline's workers): a member's samples go through that member's processor (its own statistics
  and embodiment slot: `data.dataset.host_transform`), so every member arrives in the model's layout (state and
  action padded to the model's max dims, prompts padded to one length for all members, `embodiment_id` per
  sample). Cameras keep their size; a camera slot whose members' frames differ in size is zero-padded to the
  largest (a canvas), with each member's own size remembered.
- L2 (the host thread): the rows of each member in the batch, for the device step.
- L3 (the copy thread, on the device): the training image transform, once for the batch when every member's
  cameras share their sizes, else once per member on its rows cut out of the canvas (each sample's random
  crop and jitter come from its own `sample_seed` either way), scattered back into `pixel_values`.
A batch thus mixes embodiments, and the action head's per-embodiment projections see several slots.
"""

from __future__ import annotations

import dataclasses
import json
import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch

from .._errors import ConfigError, DataError
from . import dataset as _data
from .mixture import MixtureEntry, member_config, member_error

log = logging.getLogger(__name__)
ROWS_KEY = "mixture_rows"
"""Host-side batch key: per member, the batch rows that came from it (lists of int)."""
MIXTURE_META = "mixture.json"
"""dataset_meta/ file listing the members; each member's modality.json, stats.json and split.json lie in
dataset_meta/<index>-<label>/."""


@dataclasses.dataclass
class MemberPlan:
    """A mixture entry's single-dataset view, checked on metadata only."""

    entry: MixtureEntry
    cfg: Any
    features: Any
    split: Any


@dataclasses.dataclass
class MixtureData:
    """The members opened, and the mixture dataset over them."""

    entries: list[MixtureEntry]
    members: list[_data.TrainingData]
    dataset: Any
    """vla_io.MixtureDataset (built by `attach_processors`)."""
    frame_sizes: list[list[tuple[int, int]]]
    """Per member, per camera slot: its frames' (height, width)."""

    @property
    def canvases(self) -> list[tuple[int, int]]:
        """Per camera slot: the largest height and width over the members (frames are padded to it)."""
        slots = zip(*self.frame_sizes)
        return [(max(h for h, _ in sizes), max(w for _, w in sizes)) for sizes in slots]

    @property
    def uniform_frames(self) -> bool:
        """Every member's cameras have the slot's size: no padding, one image transform per batch."""
        return all(sizes == self.canvases for sizes in self.frame_sizes)

    def dataset_meta(self) -> dict[str, Any]:
        """{relative path: JSON content} of dataset_meta/: the members list and each member's files."""
        listing = [
            {**dataclasses.asdict(e), "folder": f"{i}-{e.label}", "samples": len(m.dataset)}
            for i, (e, m) in enumerate(zip(self.entries, self.members))
        ]
        out: dict[str, Any] = {MIXTURE_META: listing}
        for i, (entry, member) in enumerate(zip(self.entries, self.members)):
            for name, content in member.dataset_meta().items():
                out[f"{i}-{entry.label}/{name}"] = content
        return out


def check_supported(cfg) -> None:
    """What a mixture run cannot do yet; ConfigError naming the setting, before any work."""
    if cfg.optimizations.data == "dataloader":
        raise ConfigError(
            "optimizations.data", "dataloader (the ablation baseline) reads one dataset; use async or sync"
        )
    if cfg.data.prefix_cache.mode != "off":
        raise ConfigError("data.prefix_cache.mode", "reads one dataset; leave it off with data.mixture")
    if cfg.data.decode_device == "cuda":
        raise ConfigError(
            "data.decode_device",
            "cuda needs spawned data workers, which cannot carry a mixture's per-member transforms; use cpu",
        )


def plan_mixture(cfg) -> list[MemberPlan]:
    """Every entry's features and held-out split from metadata (cheap), errors naming the entry; and the
    same number of cameras in every entry."""
    check_supported(cfg)
    plans = []
    for i, entry in enumerate(cfg.data.mixture):
        view = member_config(cfg, i)
        try:
            features = _data.plan_data(view)
            split = _data.plan_split(view, features)
        except (DataError, ConfigError) as err:
            raise member_error(err, i, entry) from err
        plans.append(MemberPlan(entry, view, features, split))
    counts = [len(p.features.cameras or p.features.meta.video_keys) for p in plans]
    if len(set(counts)) > 1:
        listed = ", ".join(
            f"data.mixture[{i}] ({p.entry.label}): {n}" for i, (p, n) in enumerate(zip(plans, counts))
        )
        raise ConfigError(
            "data.mixture",
            f"every dataset must feed the model's camera slots with as many cameras ({listed}); choose them with "
            "each entry's cameras",
        )
    return plans


def open_mixture(plans: list[MemberPlan], *, model_horizon: int, progress: bool) -> MixtureData:
    """Each member opened (its training episodes, statistics and spec) and the size of its frames."""
    members = []
    for i, plan in enumerate(plans):
        try:
            members.append(
                _data.open_dataset(
                    plan.cfg,
                    model_horizon=model_horizon,
                    progress=progress,
                    plan=plan.features,
                    split=plan.split,
                )
            )
        except (DataError, ConfigError) as err:
            raise member_error(err, i, plan.entry) from err
    counts = [len(m.camera_keys) for m in members]
    if len(set(counts)) > 1:
        listed = ", ".join(f"{p.entry.label}: {m.camera_keys}" for p, m in zip(plans, members))
        raise DataError(f"data.mixture: the datasets have different numbers of cameras with video ({listed})")
    sizes = [_frame_sizes(m) for m in members]
    return MixtureData([p.entry for p in plans], members, None, sizes)


def _frame_sizes(member: _data.TrainingData) -> list[tuple[int, int]]:
    """(height, width) of each camera, from one decoded sample (exact, whatever the metadata says)."""
    first = member.dataset.get_batch([0])
    return [tuple(int(n) for n in first[key].shape[-2:]) for key in member.camera_keys]


def attach_processors(mix: MixtureData, model_config, tokenizer, vlm_seq_len: int | None) -> list:
    """One processor per member (its statistics and embodiment), all padding prompts to the same length (the
    longest prompt of any member's tasks, or model.vlm_seq_len); builds `mix.dataset`."""
    import vla_io

    processors = [
        _data.make_processor(m, model_config, tokenizer, vlm_seq_len=vlm_seq_len) for m in mix.members
    ]
    length = max(p.config.vlm_seq_len for p in processors)
    for processor, member in zip(processors, mix.members):
        processor.config.vlm_seq_len = length
        for task in member.dataset.meta.tasks.values():  # tokenized here, not in every worker
            processor.token_ids(task)
    mix.dataset = vla_io.MixtureDataset(
        [
            vla_io.MixtureMember(
                member.dataset,
                weight=entry.weight,
                transform=_member_transform(member, processor, mix.canvases),
                name=entry.label,
            )
            for entry, member, processor in zip(mix.entries, mix.members, processors)
        ]
    )
    return processors


def _member_transform(member: _data.TrainingData, processor, canvases) -> Callable[[dict], dict]:
    """A member's raw batch -> model inputs with its own processor; frames padded to the slots' canvases."""
    to_model = _data.host_transform(member, processor)
    slots = _data.CAMERA_SLOTS[: len(canvases)]

    def transform(raw: dict) -> dict:
        out = to_model(raw)
        for slot, (height, width) in zip(slots, canvases):
            frames = out[slot]
            if tuple(frames.shape[-2:]) != (height, width):
                padded = frames.new_zeros((*frames.shape[:-2], height, width))
                padded[..., : frames.shape[-2], : frames.shape[-1]] = frames
                out[slot] = padded
        return out

    return transform


def host_rows(batch: dict) -> dict:
    """L2: the batch rows of each member (host lists), for `MixtureImages`."""
    import vla_io

    member = batch[vla_io.dataset.MIXTURE_KEY].numpy()
    count = int(member.max()) + 1 if len(member) else 0
    return {**batch, ROWS_KEY: [np.flatnonzero(member == m).tolist() for m in range(count)]}


class MixtureImages:
    """L3: the training image transform of a mixture batch (see the module docstring)."""

    def __init__(self, augment, mix: MixtureData) -> None:
        self.augment, self.sizes, self.uniform = augment, mix.frame_sizes, mix.uniform_frames
        self.slots = list(_data.CAMERA_SLOTS[: len(mix.canvases)])

    def __call__(self, batch: dict) -> dict:
        rows = batch.pop(ROWS_KEY)
        if self.uniform:
            return self.augment(batch)
        seeds = batch.get("sample_seed")
        out, pixels = {k: v for k, v in batch.items() if k not in self.slots}, None
        for member, picked in enumerate(rows):
            if not picked:
                continue
            index = torch.tensor(picked, device=batch[self.slots[0]].device)
            part = {
                slot: batch[slot].index_select(0, index)[..., :height, :width]
                for slot, (height, width) in zip(self.slots, self.sizes[member])
            }
            if seeds is not None:
                part["sample_seed"] = seeds[picked]
            prepared = self.augment(part)["pixel_values"]
            if pixels is None:
                pixels = prepared.new_empty((len(batch[self.slots[0]]), *prepared.shape[1:]))
            pixels.index_copy_(0, index, prepared)
        out["pixel_values"] = pixels
        return out


def save_mixture_meta(module: torch.nn.Module, folder: Path, mix: MixtureData) -> None:
    """The model, and beside it every member's modality.json, stats.json and split.json (what it normalized
    with and held out) and the members list."""
    from ..model.build import DATASET_META
    from ..model.gr00t import save_model

    save_model(module, folder)
    for name, content in mix.dataset_meta().items():
        path = folder / DATASET_META / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(content, indent=2) + "\n")
