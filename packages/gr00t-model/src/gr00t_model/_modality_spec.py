"""Joint groups from a modality.json-shaped mapping and per-feature statistics (stats.json's shape).

The groups of one kind (state or action) may slice several dataset features (`original_key`); the raw vector
the processor normalizes is those features concatenated in order of first use, so each group's `start` /
`end` is shifted by the offset of its feature in that concatenation.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import torch

from ._normalize import JointGroup, first_non_finite

DEFAULT_FEATURE = {"state": "observation.state", "action": "action"}
_STAT_NAMES = {"min": "min", "max": "max", "mean": "mean", "std": "std"}
_PERCENTILES = {"min": "q01", "max": "q99"}


def spec_fields(
    modality: Mapping[str, Any],
    stats: Mapping[str, Mapping[str, Any]],
    *,
    mean_std: Sequence[str],
    sin_cos: Sequence[str],
    relative: Mapping[str, str] | None,
    relative_stats: Mapping[str, Mapping[str, Sequence]] | None,
    use_percentiles: bool,
    source: str,
) -> dict[str, Any]:
    """`state`, `action`, `state_features` and `action_features` of an EmbodimentSpec."""
    relative, relative_stats = dict(relative or {}), dict(relative_stats or {})
    fields: dict[str, Any] = {}
    for kind in ("state", "action"):
        entries = modality.get(kind)
        if not entries:
            raise ValueError(f"{source}: modality.json needs a non-empty {kind!r} section")
        layout = _layout(kind, entries, source)
        groups = []
        for name, entry in entries.items():
            feature, start, end = _slice(kind, name, entry, source)
            offset = layout[feature][0]
            mode = _mode(name, kind, mean_std, sin_cos)
            rel = relative.get(name) if kind == "action" else None
            if rel is not None:
                if name not in relative_stats:
                    raise ValueError(f"{source}: action group {name!r} is relative but has no relative_stats")
                group_stats = relative_stats[name]
            else:
                group_stats = _group_stats(stats, feature, (start, end), mode, use_percentiles, name, source)
            groups.append(
                JointGroup(
                    name=name,
                    start=offset + start,
                    end=offset + end,
                    mode=mode,
                    stats=group_stats,
                    relative_to=rel,
                )  # fmt: skip
            )
        fields[kind] = groups
        fields[f"{kind}_features"] = [(feature, width) for feature, (_, width) in layout.items()]
    return fields


def _slice(kind: str, name: str, entry: Mapping[str, Any], source: str) -> tuple[str, int, int]:
    try:
        start, end = int(entry["start"]), int(entry["end"])
    except (KeyError, TypeError, ValueError):
        raise ValueError(
            f"{source}: modality.json {kind} group {name!r} needs integer 'start' and 'end', got {entry!r}"
        ) from None
    if not 0 <= start < end:
        raise ValueError(f"{source}: modality.json {kind} group {name!r} has an empty slice [{start}:{end}]")
    return str(entry.get("original_key") or DEFAULT_FEATURE[kind]), start, end


def _layout(kind: str, entries: Mapping[str, Any], source: str) -> dict[str, tuple[int, int]]:
    """feature -> (offset in the raw vector, width taken), features in order of first use."""
    widths: dict[str, int] = {}
    for name, entry in entries.items():
        feature, _, end = _slice(kind, name, entry, source)
        widths[feature] = max(widths.get(feature, 0), end)
    layout, offset = {}, 0
    for feature, width in widths.items():
        layout[feature] = (offset, width)
        offset += width
    return layout


def _mode(name: str, kind: str, mean_std: Sequence[str], sin_cos: Sequence[str]) -> str:
    if name in sin_cos and kind == "state":
        return "sin_cos"
    return "mean_std" if name in mean_std else "min_max"


def _group_stats(
    stats: Mapping[str, Mapping[str, Any]],
    feature: str,
    span: tuple[int, int],
    mode: str,
    use_percentiles: bool,
    group: str,
    source: str,
) -> dict[str, np.ndarray]:
    """The group's slice of the feature's statistics. Any NaN or infinite value in that slice is an error,
    whichever statistics the mode uses, naming the feature, the statistic and the index in the feature; so is
    a statistic that is not a list of numbers."""
    start, end = span
    column = stats.get(feature)
    if column is None:
        raise ValueError(f"{source}: stats.json has no statistics for {feature!r} (joint group {group!r})")
    names = {**_STAT_NAMES, **(_PERCENTILES if use_percentiles else {})}
    out = {}
    for ours, theirs in names.items():
        if theirs not in column:
            continue
        try:
            values = np.asarray(column[theirs], dtype=np.float64).reshape(-1)
        except (TypeError, ValueError) as err:
            raise ValueError(
                f"{source}: stats.json {feature!r} {theirs!r} is not a list of numbers ({err}; joint group "
                f"{group!r}): fix or recompute the statistics"
            ) from None
        if len(values) < end:
            raise ValueError(
                f"{source}: stats.json {feature!r} {theirs!r} has {len(values)} values; joint group {group!r} "
                f"reads [{start}:{end}]"
            )
        bad = first_non_finite(torch.from_numpy(values[start:end]))  # used by this mode or not
        if bad is not None:
            raise ValueError(
                f"{source}: stats.json {feature!r} {theirs!r} is {bad[1]} at index {start + bad[0]} (joint group "
                f"{group!r}); statistics must be finite: fix or recompute them"
            )
        out[ours] = values[start:end].astype(np.float32)
    return out
