"""A generic reading of `meta/modality.json`: named slices of vector features and renamed keys.

The file maps group -> name -> entry. An entry with `start`/`end` names the slice [start, end) of a vector
feature (by default `observation.state` for group "state" and `action` for group "action", otherwise its
`original_key`); an entry without them renames a whole feature (`original_key`; for group "annotation" the
default column is `annotation.<name>`).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from .._errors import DatasetFormatError

DEFAULT_KEYS = {"state": "observation.state", "action": "action"}


@dataclass(frozen=True)
class ModalityEntry:
    """One named part of a feature: `key[..., start:end]`, or the whole feature when start is None."""

    group: str
    name: str
    key: str
    start: int | None = None
    end: int | None = None

    @property
    def output_key(self) -> str:
        """The key this entry gets in `Modality.split`: "<group>.<name>"."""
        return f"{self.group}.{self.name}"

    def take(self, value: Any) -> Any:
        """This entry's part of a feature value (the slice of the last axis, or the value itself)."""
        return value if self.start is None else value[..., self.start : self.end]


class Modality:
    """The named slices of `meta/modality.json`; `split(sample)` returns them as separate keys."""

    def __init__(self, entries: list[ModalityEntry]) -> None:
        self.entries = list(entries)

    @classmethod
    def from_json(cls, data: Mapping[str, Any], source: str = "modality.json") -> Modality:
        """Parse the file's content; errors name `source`, the group and the entry."""
        entries = []
        for group, named in data.items():
            if not isinstance(named, Mapping):
                raise DatasetFormatError(f"{source}: group {group!r} must map names to entries")
            for name, spec in named.items():
                spec = spec or {}
                where = f"{source}: {group}.{name}"
                start, end = spec.get("start"), spec.get("end")
                if (start is None) != (end is None):
                    raise DatasetFormatError(f"{where} needs both 'start' and 'end' or neither")
                if start is not None and not (
                    isinstance(start, int) and isinstance(end, int) and 0 <= start < end
                ):
                    raise DatasetFormatError(f"{where}: need integers 0 <= start < end, got {start}, {end}")
                default = DEFAULT_KEYS.get(group) if start is not None else None
                if group == "annotation":
                    default = f"annotation.{name}"
                key = spec.get("original_key") or default
                if key is None:
                    raise DatasetFormatError(f"{where} needs an 'original_key'")
                entries.append(ModalityEntry(group, name, key, start, end))
        return cls(entries)

    @classmethod
    def load(cls, path: str | Path) -> Modality:
        """Read a modality.json file."""
        path = Path(path)
        try:
            data = json.loads(path.read_text())
        except (OSError, json.JSONDecodeError) as err:
            raise DatasetFormatError(f"{path}: cannot read modality file ({err})") from err
        return cls.from_json(data, str(path))

    def groups(self) -> list[str]:
        """Group names in file order."""
        return list(dict.fromkeys(e.group for e in self.entries))

    def slices(self, group: str) -> dict[str, ModalityEntry]:
        """The entries of one group by name."""
        return {e.name: e for e in self.entries if e.group == group}

    def validate(self, features: Mapping[str, Mapping[str, Any]], source: str = "modality.json") -> None:
        """Check that sliced keys exist and slices fit their feature's size (as declared in info.json)."""
        for e in self.entries:
            if e.start is None:
                continue
            if e.key not in features:
                raise DatasetFormatError(f"{source}: {e.group}.{e.name} slices unknown feature {e.key!r}")
            size = int(np.prod(features[e.key].get("shape", [0])))
            if e.end > size:
                raise DatasetFormatError(
                    f"{source}: {e.group}.{e.name} ends at {e.end} but {e.key!r} has {size} values"
                )

    def split(self, sample: Mapping[str, Any], tasks: Mapping[int, str] | None = None) -> dict[str, Any]:
        """Every entry present in `sample` as "<group>.<name>"; with `tasks`, annotation indices become text.

        Works on single samples and on collated batches alike (slices act on the last axis).
        """
        out: dict[str, Any] = {}
        for e in self.entries:
            if e.key not in sample:
                continue
            value = e.take(sample[e.key])
            if tasks is not None and e.group == "annotation":
                value = _as_text(value, tasks)
            out[e.output_key] = value
        return out

    def split_stats(self, stats: Mapping[str, Mapping[str, Any]]) -> dict[str, dict[str, np.ndarray]]:
        """Statistics of each sliced entry, cut from the statistics of its feature."""
        out = {}
        for e in self.entries:
            if e.start is not None and e.key in stats:
                out[e.output_key] = {
                    k: (np.asarray(v)[..., e.start : e.end] if k != "count" else np.asarray(v))
                    for k, v in stats[e.key].items()
                }
        return out

    def __repr__(self) -> str:
        parts = ", ".join(
            f"{e.output_key}<-{e.key}" + (f"[{e.start}:{e.end}]" if e.start is not None else "")
            for e in self.entries
        )
        return f"Modality({parts})"


def _as_text(value: Any, tasks: Mapping[int, str]) -> Any:
    array = np.asarray(value)
    if array.dtype.kind not in "iu":
        return value
    if array.ndim == 0:
        return tasks.get(int(array), "")
    return [_as_text(v, tasks) for v in array]
