"""State/action normalization per joint group, from dataset statistics.

min_max maps [min, max] to [-1, 1] and clips; mean_std standardizes; sin_cos (state only) replaces x by
[sin x, cos x]; none passes through. A relative action group first subtracts the last state frame of its
`relative_to` state group; its statistics are then per step ([horizon, dims]) as in the release.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from ._embodiment import embodiment_id

MODES = ("min_max", "mean_std", "sin_cos", "none")
STAT_KEYS = {"min_max": ("min", "max"), "mean_std": ("mean", "std"), "sin_cos": (), "none": ()}


@dataclass(kw_only=True)
class JointGroup:
    """A named slice [start, end) of the raw state or action vector and how it is normalized."""

    name: str
    start: int
    end: int
    mode: str = "min_max"
    stats: Mapping[str, Sequence] = field(default_factory=dict)
    """Arrays of shape [dims] (or [horizon, dims] for relative actions) under min/max or mean/std."""
    relative_to: str | None = None
    """Action groups only: the state group whose last frame is subtracted before normalizing."""

    def __post_init__(self) -> None:
        if self.mode not in MODES:
            raise ValueError(f"JointGroup {self.name!r}: mode must be one of {MODES}, got {self.mode!r}")
        if not 0 <= self.start < self.end:
            raise ValueError(
                f"JointGroup {self.name!r}: need 0 <= start < end, got [{self.start}, {self.end})"
            )
        missing = [k for k in STAT_KEYS[self.mode] if k not in self.stats]
        if missing:
            raise ValueError(f"JointGroup {self.name!r}: mode {self.mode} needs stats {missing}")
        converted = {}
        for key, value in self.stats.items():
            try:
                converted[key] = torch.as_tensor(np.asarray(value, dtype=np.float32))
            except (TypeError, ValueError) as err:
                raise ValueError(f"JointGroup {self.name!r}: stats[{key!r}] is not numbers ({err})") from None
        self.stats = converted
        for key, value in self.stats.items():
            if value.shape[-1] != self.dim:
                raise ValueError(
                    f"JointGroup {self.name!r}: stats[{key!r}] has {value.shape[-1]} values, group has {self.dim} dims"
                )
        for key in self.stats:  # any of them: a NaN min/max would silently zero the joint (span > 0 is False)
            bad = first_non_finite(self.stats[key])
            if bad is not None:
                raise ValueError(
                    f"JointGroup {self.name!r}: stats[{key!r}] is {bad[1]} at index {bad[0]}; "
                    "statistics must be finite"
                )

    @property
    def dim(self) -> int:
        """Raw width of the group."""
        return self.end - self.start

    @property
    def out_dim(self) -> int:
        """Width after normalization (sin_cos doubles it)."""
        return 2 * self.dim if self.mode == "sin_cos" else self.dim

    def _stat(self, key: str, x: torch.Tensor) -> torch.Tensor:
        value = self.stats[key]
        if value.ndim == 2:  # per-step [horizon, dims]
            value = value[: x.shape[-2]]
        return value.to(x.device)

    def normalize(self, x: torch.Tensor) -> torch.Tensor:
        """[..., dim] raw -> [..., out_dim] normalized (float32)."""
        x = x.to(torch.float32)
        if self.mode == "min_max":
            low, high = self._stat("min", x), self._stat("max", x)
            span = high - low
            scaled = 2 * (x - low) / torch.where(span > 0, span, torch.ones_like(span)) - 1
            return torch.where(span > 0, scaled, torch.zeros_like(scaled)).clamp(-1.0, 1.0)
        if self.mode == "mean_std":
            mean, std = self._stat("mean", x), self._stat("std", x)
            scaled = (x - mean) / torch.where(std > 0, std, torch.ones_like(std))
            return torch.where(std > 0, scaled, torch.zeros_like(scaled))
        if self.mode == "sin_cos":
            return torch.cat((x.sin(), x.cos()), dim=-1)
        return x

    def unnormalize(self, x: torch.Tensor) -> torch.Tensor:
        """Inverse of normalize (not defined for sin_cos)."""
        x = x.to(torch.float32)
        if self.mode == "min_max":
            low, high = self._stat("min", x), self._stat("max", x)
            return (x.clamp(-1.0, 1.0) + 1) / 2 * (high - low) + low
        if self.mode == "mean_std":
            return x * self._stat("std", x) + self._stat("mean", x)
        if self.mode == "sin_cos":
            raise ValueError(f"JointGroup {self.name!r}: sin_cos is not invertible")
        return x


@dataclass(kw_only=True)
class EmbodimentSpec:
    """How one embodiment's raw vectors become model inputs: groups in order, chunk length, projector slot."""

    tag: str
    state: list[JointGroup]
    action: list[JointGroup]
    action_horizon: int
    slot: int | None = None
    """Projector slot; default: EMBODIMENT_TAGS[tag]."""
    state_features: list[tuple[str, int]] | None = None
    """Dataset features the raw state vector concatenates, in order, as (key, leading values taken); group
    `start`/`end` index that concatenation. None: the raw vector is given as one array (`state`)."""
    action_features: list[tuple[str, int]] | None = None
    """The same for the raw action vector."""

    def __post_init__(self) -> None:
        self.slot = embodiment_id(self.tag if self.slot is None else self.slot)
        if self.action_horizon <= 0:
            raise ValueError(f"EmbodimentSpec {self.tag!r}: action_horizon must be > 0")
        states = {g.name: g for g in self.state}
        for group in self.action:
            if group.relative_to is None:
                continue
            ref = states.get(group.relative_to)
            if ref is None or ref.dim != group.dim:
                raise ValueError(
                    f"EmbodimentSpec {self.tag!r}: action group {group.name!r} is relative to state group "
                    f"{group.relative_to!r}, which must exist with {group.dim} dims"
                )
        for group in self.action:
            if group.mode == "sin_cos":
                raise ValueError(
                    f"EmbodimentSpec {self.tag!r}: action group {group.name!r} cannot use sin_cos"
                )

    @property
    def state_dim(self) -> int:
        return sum(g.out_dim for g in self.state)

    @property
    def action_dim(self) -> int:
        return sum(g.out_dim for g in self.action)

    def normalize_state(self, state: torch.Tensor) -> torch.Tensor:
        """[B, raw] -> [B, state_dim]."""
        return torch.cat([g.normalize(state[..., g.start : g.end]) for g in self.state], dim=-1)

    def normalize_action(self, action: torch.Tensor, state: torch.Tensor) -> torch.Tensor:
        """[B, T, raw] (+ raw state [B, raw]) -> [B, T, action_dim]."""
        parts = []
        for g in self.action:
            x = action[..., g.start : g.end].to(torch.float32)
            if g.relative_to is not None:
                x = x - self._state_group(g.relative_to, state)[:, None]
            parts.append(g.normalize(x))
        return torch.cat(parts, dim=-1)

    def unnormalize_action(self, action: torch.Tensor, state: torch.Tensor) -> torch.Tensor:
        """[B, T, action_dim] normalized (+ raw state [B, raw]) -> [B, T, raw action width]."""
        parts, offset = [], 0
        for g in self.action:
            x = g.unnormalize(action[..., offset : offset + g.dim])
            if g.relative_to is not None:
                x = x + self._state_group(g.relative_to, state)[:, None]
            parts.append(x)
            offset += g.dim
        return torch.cat(parts, dim=-1)

    def gather_state(self, sample: Mapping[str, torch.Tensor]) -> torch.Tensor:
        """The raw state vector [..., D] from a dataset sample or batch keyed by feature (`state_features`)."""
        return _gather(sample, self.state_features, "observation.state")

    def gather_action(self, sample: Mapping[str, torch.Tensor]) -> torch.Tensor:
        """The raw action vector (chunk) [..., D] from a sample or batch keyed by feature (`action_features`)."""
        return _gather(sample, self.action_features, "action")

    def _state_group(self, name: str, state: torch.Tensor) -> torch.Tensor:
        ref = next(g for g in self.state if g.name == name)
        return state[..., ref.start : ref.end].to(torch.float32)

    @classmethod
    def from_lerobot_meta(
        cls,
        meta_dir: str | Path,
        tag: str,
        *,
        action_horizon: int,
        mean_std: Sequence[str] = (),
        sin_cos: Sequence[str] = (),
        relative: Mapping[str, str] | None = None,
        relative_stats: Mapping[str, Mapping[str, Sequence]] | None = None,
        use_percentiles: bool = False,
    ) -> EmbodimentSpec:
        """Groups from `meta/modality.json` (state/action slices) and stats from `meta/stats.json`.

        mean_std / sin_cos: group names using those modes; relative: {action group: state group};
        relative_stats: {action group: {min, max, mean, std} per step} (see relative_action_stats).
        use_percentiles takes q01/q99 as min/max. See `from_modality` for the format.
        """
        meta = Path(meta_dir)
        return cls.from_modality(
            _load(meta / "modality.json"), _load(meta / "stats.json"), tag, action_horizon=action_horizon,
            mean_std=mean_std, sin_cos=sin_cos, relative=relative, relative_stats=relative_stats,
            use_percentiles=use_percentiles, source=str(meta),
        )  # fmt: skip

    @classmethod
    def from_modality(
        cls,
        modality: Mapping[str, Any],
        stats: Mapping[str, Mapping[str, Any]],
        tag: str,
        *,
        action_horizon: int,
        mean_std: Sequence[str] = (),
        sin_cos: Sequence[str] = (),
        relative: Mapping[str, str] | None = None,
        relative_stats: Mapping[str, Mapping[str, Sequence]] | None = None,
        use_percentiles: bool = False,
        source: str = "modality",
    ) -> EmbodimentSpec:
        """Groups from a modality.json-shaped mapping and per-feature statistics (stats.json's shape).

        `modality["state"]` / `modality["action"]`: {group: {"start", "end", "original_key"?}}, slices
        [start, end) of the feature `original_key` (default `observation.state` / `action`). The raw vector
        concatenates the features in order of first use (`state_features` / `action_features`). Statistics
        that are NaN or infinite are an error naming the feature, statistic and index (`source` names where
        they came from in messages).
        """
        from ._modality_spec import spec_fields

        fields = spec_fields(
            modality, stats, mean_std=mean_std, sin_cos=sin_cos, relative=relative,
            relative_stats=relative_stats, use_percentiles=use_percentiles, source=source,
        )  # fmt: skip
        return cls(tag=tag, action_horizon=action_horizon, **fields)


def first_non_finite(values: torch.Tensor) -> tuple[tuple[int, ...] | int, float] | None:
    """(index, value) of the first NaN or infinite entry, or None; a 1-d index is a plain int."""
    bad = (~torch.isfinite(values)).nonzero()
    if not len(bad):
        return None
    index = tuple(int(i) for i in bad[0])
    return (index[0] if len(index) == 1 else index), float(values[index])


def _gather(sample: Mapping[str, Any], features: list[tuple[str, int]] | None, default: str) -> torch.Tensor:
    if features is None:
        return torch.as_tensor(sample[default])
    parts = []
    for key, width in features:
        if key not in sample:
            raise KeyError(f"sample has no feature {key!r} (it has {sorted(sample)})")
        value = torch.as_tensor(sample[key])
        if value.shape[-1] < width:
            raise ValueError(f"feature {key!r} has {value.shape[-1]} values, the joint groups need {width}")
        parts.append(value[..., :width])
    return parts[0] if len(parts) == 1 else torch.cat([p.to(torch.float32) for p in parts], dim=-1)


def relative_action_stats(
    spec: EmbodimentSpec, states: torch.Tensor, actions: torch.Tensor
) -> dict[str, dict[str, np.ndarray]]:
    """Per-step stats of relative action groups from raw samples: states [N, raw], action chunks [N, T, raw]."""
    out = {}
    for g in spec.action:
        if g.relative_to is None:
            continue
        rel = (
            actions[..., g.start : g.end].to(torch.float64)
            - spec._state_group(g.relative_to, states).double()[:, None]
        )
        out[g.name] = {
            "min": rel.amin(0).numpy(),
            "max": rel.amax(0).numpy(),
            "mean": rel.mean(0).numpy(),
            "std": rel.std(0, unbiased=False).numpy(),
        }
    return out


def _load(path: Path) -> dict:
    if not path.exists():
        raise FileNotFoundError(f"{path} not found")
    return json.loads(path.read_text())
