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
        self.stats = {k: torch.as_tensor(np.asarray(v, dtype=np.float32)) for k, v in self.stats.items()}
        for key, value in self.stats.items():
            if value.shape[-1] != self.dim:
                raise ValueError(
                    f"JointGroup {self.name!r}: stats[{key!r}] has {value.shape[-1]} values, group has {self.dim} dims"
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
        use_percentiles takes q01/q99 as min/max.
        """
        meta = Path(meta_dir)
        modality, stats = _load(meta / "modality.json"), _load(meta / "stats.json")
        relative, relative_stats = dict(relative or {}), dict(relative_stats or {})
        groups: dict[str, list[JointGroup]] = {}
        for kind, column in (("state", "observation.state"), ("action", "action")):
            if kind not in modality or column not in stats:
                raise ValueError(f"{meta}: modality.json needs '{kind}' and stats.json needs '{column}'")
            groups[kind] = []
            for name, span in modality[kind].items():
                start, end = int(span["start"]), int(span["end"])
                mode = (
                    "sin_cos"
                    if name in sin_cos and kind == "state"
                    else "mean_std"
                    if name in mean_std
                    else "min_max"
                )
                rel = relative.get(name) if kind == "action" else None
                if rel is not None:
                    if name not in relative_stats:
                        raise ValueError(
                            f"{meta}: action group {name!r} is relative but has no relative_stats"
                        )
                    group_stats = relative_stats[name]
                else:
                    group_stats = _slice_stats(stats[column], start, end, use_percentiles)
                groups[kind].append(
                    JointGroup(name=name, start=start, end=end, mode=mode, stats=group_stats, relative_to=rel)
                )
        return cls(tag=tag, state=groups["state"], action=groups["action"], action_horizon=action_horizon)


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


def _slice_stats(
    column: Mapping[str, Sequence], start: int, end: int, use_percentiles: bool
) -> dict[str, np.ndarray]:
    names = {
        "min": "q01" if use_percentiles else "min",
        "max": "q99" if use_percentiles else "max",
        "mean": "mean",
        "std": "std",
    }
    return {
        ours: np.asarray(column[theirs], dtype=np.float32)[start:end]
        for ours, theirs in names.items()
        if theirs in column
    }


def _load(path: Path) -> dict:
    if not path.exists():
        raise FileNotFoundError(f"{path} not found")
    return json.loads(path.read_text())
