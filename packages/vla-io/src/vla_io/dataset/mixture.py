"""`MixtureDataset`: several datasets behind one index space, each sampled by its weight.

Member m's samples are the indices `offsets[m] .. offsets[m] + len(member m)`. A batch is loaded member by
member (each member's own `get_batch`, or `__getitem__` + `collate`), each member's part goes through that
member's `transform` (in the loading process: a pipeline worker), and the parts are merged back into the
requested order. So members may differ in anything (features, state sizes, camera sizes) as long as their
transforms bring them to one layout: every tensor key must have the same per-sample shape and dtype in
every member's output, and every list key must exist in each. The merged batch says which member each
sample came from under `MIXTURE_KEY` (int64 [B]).

`Pipeline` orders a mixture's samples with `MixtureSampler` (`epoch_sampler`): pick a member by weight,
then a sample of it uniformly (see `vla_io.pipeline.mixture_sampler`).
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from .._errors import DatasetFormatError

MIXTURE_KEY = "mixture_index"
"""Batch key: the member each sample came from (int64 [B])."""
Batch = dict[str, Any]


@dataclass
class MixtureMember:
    """One dataset of a mixture."""

    dataset: Any
    """Anything with `__len__` and `get_batch(indices)` or `__getitem__` (e.g. `LeRobotDataset`)."""
    weight: float | None = None
    """Sampling weight (any positive scale; normalized over the members); None for every member = proportional
    to the members' sizes."""
    transform: Callable[[Batch], Mapping[str, Any]] | None = None
    """Brings this member's collated batch to the mixture's common layout; runs where the batch is loaded."""
    name: str = ""
    """Shown in errors (default: `member <i>`)."""


class MixtureDataset:
    """Members concatenated into one index space; `get_batch` merges their transformed parts (see the
    module docstring). Weights: every member's `weight`, or none (proportional to the members' sizes);
    `epoch_samples` is the length of a pipeline epoch (default: the members' total size)."""

    def __init__(self, members: Sequence[MixtureMember], *, epoch_samples: int | None = None) -> None:
        from ..pipeline.mixture_sampler import mixture_weights

        self.members = list(members)
        if not self.members:
            raise ValueError("MixtureDataset needs at least one member")
        given = [m.weight is not None for m in self.members]
        if any(given) and not all(given):
            missing = [self._name(i) for i, g in enumerate(given) if not g]
            raise ValueError(f"mixture weights: give every member a weight or none; {missing} have none")
        self.sizes = [len(m.dataset) for m in self.members]
        for i, size in enumerate(self.sizes):
            if size < 1:
                raise ValueError(f"mixture {self._name(i)} has no samples")
        self.weights = mixture_weights(
            self.sizes, [m.weight for m in self.members] if all(given) else "proportional"
        )
        self.offsets = np.concatenate([[0], np.cumsum(self.sizes)]).astype(np.int64)
        self.epoch_samples = epoch_samples
        decode = {str(getattr(m.dataset, "decode_device", "cpu")) for m in self.members}
        self.decode_device = "cpu" if decode == {"cpu"} else sorted(decode - {"cpu"})[0]

    def _name(self, i: int) -> str:
        return self.members[i].name or f"member {i}"

    def __len__(self) -> int:
        return int(self.offsets[-1])

    def locate(self, indices: Sequence[int] | np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(member, index within the member) of each global index."""
        indices = np.asarray(indices, dtype=np.int64).reshape(-1)
        if len(indices) and (indices.min() < 0 or indices.max() >= len(self)):
            raise IndexError(f"mixture index out of range [0, {len(self)}): {indices.min()}..{indices.max()}")
        member = np.searchsorted(self.offsets, indices, side="right") - 1
        return member, indices - self.offsets[member]

    def sample_location(self, index: int) -> tuple[Any, Any]:
        """(episode, frame) of a sample as its member says (for skip notes); the episode is prefixed with
        the member's name."""
        member, local = self.locate([index])
        locate = getattr(self.members[member[0]].dataset, "sample_location", None)
        if locate is None:
            return None, None
        episode, frame = locate(int(local[0]))
        return f"{self._name(int(member[0]))}: {episode}", frame

    def affinity(self, indices: Sequence[int] | np.ndarray) -> np.ndarray:
        """A routing key per sample (see `PipelineConfig.affinity`): its member's key (`LeRobotDataset`: the
        episode; else the sample) made unique across members."""
        member, local = self.locate(indices)
        keys = np.empty(len(member), dtype=np.int64)
        for m in np.unique(member).tolist():
            rows = np.flatnonzero(member == m)
            own = getattr(self.members[m].dataset, "affinity", None)
            found = np.asarray(own(local[rows]) if own is not None else local[rows], dtype=np.int64)
            keys[rows] = found * len(self.members) + m
        return keys

    def prefers_affinity(self) -> bool:
        """True when a member prefers routing by affinity (more video files than a worker keeps open)."""
        return any(bool(getattr(m.dataset, "prefers_affinity", lambda: False)()) for m in self.members)

    def epoch_sampler(self, batch_size: int, **options: Any):
        """The `MixtureSampler` that orders this mixture's samples (`Pipeline` asks for it)."""
        from ..pipeline.mixture_sampler import MixtureSampler

        return MixtureSampler(
            self.sizes, batch_size, weights=self.weights, epoch_samples=self.epoch_samples, **options
        )

    def get_batch(
        self,
        indices: Sequence[int] | np.ndarray,
        *,
        image_dtype: str | None = None,
        shared_memory: bool = False,
    ) -> Batch:
        """The samples at `indices` (global), each member's part transformed, merged in request order, with
        `MIXTURE_KEY`. `shared_memory` puts the merged tensors in shared memory (in a pipeline worker: the
        batch's arena)."""
        member, local = self.locate(indices)
        parts: list[tuple[int, np.ndarray, Batch]] = []
        for m in np.unique(member).tolist():
            rows = np.flatnonzero(member == m)
            part = self._load(m, local[rows], image_dtype)
            transform = self.members[m].transform
            parts.append((m, rows, dict(transform(part)) if transform is not None else part))
        merged = _merge(parts, len(member), self._name, shared_memory)
        merged[MIXTURE_KEY] = torch.from_numpy(member.copy())
        return merged

    def _load(self, m: int, local: np.ndarray, image_dtype: str | None) -> Batch:
        dataset = self.members[m].dataset
        get_batch = getattr(dataset, "get_batch", None)
        if get_batch is None:
            from ..pipeline.collation import collate

            return collate([dataset[int(i)] for i in local])
        kwargs = {}
        if image_dtype is not None and "image_dtype" in inspect.signature(get_batch).parameters:
            kwargs["image_dtype"] = image_dtype
        return dict(get_batch(local, **kwargs))


def _merge(
    parts: list[tuple[int, np.ndarray, Batch]], size: int, name: Callable[[int], str], shared: bool
) -> Batch:
    """One batch of `size` rows from members' parts (member, its rows in the batch, its batch)."""
    from ..pipeline.shm import shared_empty

    first_member, _, first = parts[0]
    for m, _, part in parts[1:]:
        if set(part) != set(first):
            odd = sorted(set(part) ^ set(first))
            raise DatasetFormatError(
                f"mixture: {name(m)} and {name(first_member)} give different keys ({odd}); their transforms "
                "must bring every member to the same keys"
            )
    out: Batch = {}
    for key, value in first.items():
        if isinstance(value, torch.Tensor):
            for m, _, part in parts[1:]:
                other = part[key]
                if not isinstance(other, torch.Tensor) or (other.shape[1:], other.dtype) != (
                    value.shape[1:],
                    value.dtype,
                ):
                    raise DatasetFormatError(
                        f"mixture key {key!r}: {name(m)} gives {_shape(other)} per sample, {name(first_member)} "
                        f"{_shape(value)}; their transforms must bring every member to one shape and dtype"
                    )
            shape = (size, *value.shape[1:])
            merged = shared_empty(shape, value.dtype) if shared else torch.empty(shape, dtype=value.dtype)
            for _, rows, part in parts:
                merged[torch.from_numpy(rows)] = part[key]
            out[key] = merged
        else:
            items: list[Any] = [None] * size
            for _, rows, part in parts:
                for row, item in zip(rows.tolist(), part[key]):
                    items[row] = item
            out[key] = items
    return out


def _shape(value: Any) -> str:
    if isinstance(value, torch.Tensor):
        return f"{value.dtype} {tuple(value.shape[1:])}"
    return type(value).__name__
