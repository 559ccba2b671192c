"""Which dataset features feed the model: cameras, and state / action joint groups in modality.json's shape.

Read from the dataset's metadata only (no parquet, no video), so a dataset that cannot be mapped stops the
run before any heavy work, with a message that lists the dataset's features and the settings that choose
them. Groups come from `data.state_keys` / `data.action_keys` (features, or modality.json groups), else
from modality.json (`data.modality_file` or the dataset's meta/modality.json), else the LeRobot defaults
`observation.state` and `action`, one group each (or one per entry of a feature's `names` dict).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .._errors import DataError

DEFAULT_FEATURE = {"state": "observation.state", "action": "action"}
LEROBOT_INDEX_COLUMNS = {"timestamp", "frame_index", "episode_index", "index", "task_index"}
NUMERIC = ("float", "int", "uint", "bool")
HOW_TO_CHOOSE = (
    "Choose them with --set data.state_keys=FEATURE[,FEATURE...] and --set data.action_keys=FEATURE[,...], "
    "or give GR00T joint groups with --set data.modality_file=PATH (a modality.json; see the gr00t-train README)"
)


@dataclass
class FeatureMap:
    """The dataset's metadata and what of it feeds the model."""

    root: Path
    meta: Any
    """vla_io.DatasetMeta."""
    cameras: list[str] | None
    """Video feature keys in order; None = every camera with files."""
    modality: dict[str, Any] = field(default_factory=dict)
    """{"state": {group: {start, end, original_key}}, "action": {...}, "video": {name: {original_key}}}."""
    source: str = ""
    """Where the groups came from, for messages."""

    def features(self, kind: str) -> list[str]:
        """Features the `kind` groups read, in order of first use."""
        return list(dict.fromkeys(g["original_key"] for g in self.modality[kind].values()))


def map_features(cfg: Any, meta: Any, root: Path, modality_file: Path | None = None) -> FeatureMap:
    """Cameras and joint groups for `cfg.data` on this dataset; DataError naming features and settings."""
    groups_file = modality_file or (Path(cfg.data.modality_file) if cfg.data.modality_file else None)
    if groups_file is None and (root / "meta" / "modality.json").is_file():
        groups_file = root / "meta" / "modality.json"
    given = _read_modality(groups_file) if groups_file else {}
    where = str(groups_file) if groups_file else "the dataset's features"
    video = {
        name: {"original_key": e.get("original_key", name)} for name, e in given.get("video", {}).items()
    }
    cameras = None if cfg.data.cameras is None else _camera_keys(meta, cfg.data.cameras, root, video)
    fmap = FeatureMap(root, meta, cameras, {"video": video}, where)
    for kind in ("state", "action"):
        # a checkpoint's own modality.json holds the groups it was trained with: no selection applies
        wanted = None if modality_file is not None else getattr(cfg.data, f"{kind}_keys")
        fmap.modality[kind] = _groups(kind, wanted, given.get(kind) or {}, meta, root, where)
    _check_state_is_not_action(fmap, cfg, modality_file is None)
    return fmap


def _check_state_is_not_action(fmap: FeatureMap, cfg: Any, selectable: bool) -> None:
    """A feature read as action (loaded as [horizon, D] chunks) cannot also be state ([D] per frame)."""
    actions = set(fmap.features("action"))
    both = [key for key in fmap.features("state") if key in actions]
    if both:
        setting = "data.state_keys" if selectable and cfg.data.state_keys is not None else fmap.source
        raise DataError(
            f"{setting}: {', '.join(repr(k) for k in both)} is the action feature of this run and cannot also "
            f"be state; choose state features other than the action ({', '.join(sorted(actions))}). "
            f"Features of dataset {fmap.root}: {describe_features(fmap.meta)}"
        )


def _read_modality(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        raise DataError(f"data.modality_file: {path} not found") from None
    except (OSError, ValueError) as err:
        raise DataError(f"data.modality_file: cannot read {path} as JSON ({err})") from err
    if not isinstance(data, dict):
        raise DataError(f"{path}: a modality.json is an object with 'state', 'action' and 'video' sections")
    return data


def _normalized(given: dict[str, Any], kind: str) -> dict[str, dict[str, Any]]:
    return {
        name: {"start": int(e["start"]), "end": int(e["end"]),
               "original_key": e.get("original_key") or DEFAULT_FEATURE[kind]}
        for name, e in (given.get(kind) or {}).items()
    }  # fmt: skip


def _groups(
    kind: str, wanted: list[str] | None, given: dict[str, Any], meta: Any, root: Path, where: str
) -> dict[str, dict[str, Any]]:
    """{group: {start, end, original_key}} for one kind, validated against the dataset's features."""
    named = _normalized({kind: given}, kind)
    if wanted is None:
        if named:
            chosen = named
        elif DEFAULT_FEATURE[kind] in vector_features(meta):
            chosen = feature_groups(DEFAULT_FEATURE[kind], meta.features[DEFAULT_FEATURE[kind]])
        else:
            raise DataError(
                f"dataset {root} has no {DEFAULT_FEATURE[kind]!r} feature to use as the {kind} and no "
                f"modality.json; its features: {describe_features(meta)}. {HOW_TO_CHOOSE}"
            )
    else:
        chosen = {}
        for entry in wanted:
            if entry in named:
                chosen[entry] = named[entry]
            elif entry in vector_features(meta):
                for name, group in feature_groups(entry, meta.features[entry]).items():
                    chosen[name if name not in chosen else f"{entry}.{name}"] = group
            else:
                groups = f"; {where} has {kind} groups {', '.join(named)}" if named else ""
                raise DataError(
                    f"data.{kind}_keys: {entry!r} is not a numeric vector feature of dataset {root}{groups}. "
                    f"Its features: {describe_features(meta)}"
                )
    for name, group in chosen.items():
        _check_group(kind, name, group, meta, root, where)
    return chosen


def feature_groups(key: str, feature: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """A feature as joint groups: one per entry of a `names` dict of lists (when they add up to the
    feature's width and there are several), else the whole feature as one group named after it."""
    width = _width(feature)
    names = feature.get("names")
    split = isinstance(names, dict) and len(names) > 1 and all(isinstance(v, list) for v in names.values())
    if split and sum(len(v) for v in names.values()) == width:
        groups, start = {}, 0
        for name, members in names.items():
            groups[name] = {"start": start, "end": start + len(members), "original_key": key}
            start += len(members)
        return groups
    return {key: {"start": 0, "end": width, "original_key": key}}


def vector_features(meta: Any) -> dict[str, int]:
    """Numeric 1-d features of the dataset (LeRobot's index columns left out) -> width."""
    out = {}
    for key, feature in meta.features.items():
        dtype = str(feature.get("dtype", ""))
        shape = feature.get("shape") or []
        if key in LEROBOT_INDEX_COLUMNS or not dtype.startswith(NUMERIC) or len(shape) != 1:
            continue
        out[key] = int(shape[0])
    return out


def describe_features(meta: Any) -> str:
    """Every feature with its dtype and shape, e.g. `observation.state (float32[8])`."""
    return ", ".join(
        f"{key} ({f.get('dtype')}{list(f.get('shape') or [])})"
        for key, f in meta.features.items()
        if key not in LEROBOT_INDEX_COLUMNS
    )


def _width(feature: dict[str, Any]) -> int:
    shape = feature.get("shape") or [1]
    return int(shape[0]) if len(shape) == 1 else -1


def _check_group(kind: str, name: str, group: dict[str, Any], meta: Any, root: Path, where: str) -> None:
    key, end = group["original_key"], group["end"]
    width = vector_features(meta).get(key)
    if width is None:
        raise DataError(
            f"{where}: {kind} group {name!r} reads feature {key!r}, which dataset {root} does not have as a "
            f"numeric vector. Its features: {describe_features(meta)}. {HOW_TO_CHOOSE}"
        )
    if not 0 <= group["start"] < end <= width:
        raise DataError(
            f"{where}: {kind} group {name!r} slices [{group['start']}:{end}] of {key!r}, which has {width} values"
        )


def _camera_keys(meta: Any, wanted: list[str], root: Path, video: dict[str, Any]) -> list[str]:
    """Feature keys of the wanted cameras; names may be modality.json's short names or full keys."""
    available = list(meta.video_keys)
    short = {name: entry["original_key"] for name, entry in video.items()}
    for key in available:
        short.setdefault(key.removeprefix("observation.images."), key)
    keys = []
    for name in wanted:
        key = short.get(name, name if name in available else None)
        if key is None or key not in available:
            raise DataError(
                f"data.cameras: camera {name!r} is not in dataset {root}; {_cameras_of(available, video)}"
            )
        keys.append(key)
    return keys


def _cameras_of(available: list[str], video: dict[str, Any]) -> str:
    """The dataset's own video features (short names), then the modality.json cameras whose key it lacks."""
    names = [key.removeprefix("observation.images.") for key in available]
    said = f"it has {', '.join(names) or 'no cameras'}"
    broken = [
        f"{name} -> {e['original_key']}" for name, e in video.items() if e["original_key"] not in available
    ]
    if broken:
        said += f"; modality.json cameras that point to a video feature it does not have: {', '.join(broken)}"
    return said
