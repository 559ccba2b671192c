"""`data.mixture`: training on several LeRobot datasets at once, each with its weight, cameras, embodiment
and joint groups. This module owns the setting (`MixtureEntry`), its rules against the single-dataset keys,
each member's view of the run's config (the single-dataset settings it stands for), and the fingerprint a
checkpoint records of all members. The data side is `data.mixture_data`."""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path
from typing import Any

from .._errors import ConfigError, DataError
from ..config.types import Section, require

PER_DATASET = ("dataset", "cameras", "state_keys", "action_keys", "modality_file", "embodiment_tag")
"""The data settings one mixture entry gives per dataset (data.<key> must stay unset with data.mixture)."""
_DEFAULT_TAG = "new_embodiment"


@dataclasses.dataclass(kw_only=True)
class MixtureEntry(Section):
    """One dataset of `data.mixture`."""

    dataset: str = ""
    """Root folder of a LeRobot dataset (as data.dataset)."""
    weight: float | None = None
    """Sampling weight (any positive scale; normalized over the entries): each sample picks a dataset by weight,
    then one of its samples uniformly. None for every entry = proportional to the datasets' sizes."""
    cameras: list[str] | None = None
    """Cameras in the model's camera slots, in order (as data.cameras); every entry must feed as many."""
    embodiment_tag: str = _DEFAULT_TAG
    """The dataset's embodiment: its projector slot in the action head (as data.embodiment_tag)."""
    state_keys: list[str] | None = None
    """State features or modality.json groups (as data.state_keys)."""
    action_keys: list[str] | None = None
    """Action features or modality.json groups (as data.action_keys)."""
    modality_file: str | None = None
    """A modality.json to use instead of the dataset's own (as data.modality_file)."""
    name: str = ""
    """A short name for logs, errors and the checkpoint's dataset_meta/ folder; default: the folder's name."""

    def _check(self) -> None:
        require(bool(self.dataset), "dataset", "must name a LeRobot dataset folder")
        weight = self.weight
        require(weight is None or weight > 0, "weight", f"must be > 0 or none, got {weight}")
        for key in ("cameras", "state_keys", "action_keys"):
            keys = getattr(self, key)
            require(keys is None or len(keys) > 0, key, "must list at least one key, or be none (all)")
        require(
            not self.name or re.fullmatch(r"[\w.-]+", self.name) is not None, "name", "letters, digits, . _ -"
        )

    @property
    def label(self) -> str:
        """The entry's name, or its dataset folder's."""
        return self.name or Path(self.dataset).name


def check_mixture(data: Any) -> None:
    """With `data.mixture` set, the per-dataset keys belong to its entries; ConfigError naming the field."""
    entries = data.mixture
    if entries is None:
        return
    require(len(entries) > 0, "mixture", "must list at least one dataset, or be none")
    for key in PER_DATASET:
        value = getattr(data, key)
        unset = value == _DEFAULT_TAG if key == "embodiment_tag" else value in (None, "")
        require(
            unset,
            key,
            f"must be unset with data.mixture (each entry gives its own {key}), got {value!r}",
        )
    given = [entry.weight is not None for entry in entries]
    if any(given) and not all(given):
        missing = [i for i, g in enumerate(given) if not g]
        raise ConfigError(
            f"mixture[{missing[0]}].weight",
            "give every entry a weight, or none (weights proportional to the datasets' sizes)",
        )
    labels = [entry.label for entry in entries]
    twice = sorted({label for label in labels if labels.count(label) > 1})
    require(not twice, "mixture", f"two entries are called {twice[0] if twice else ''}; give them names")


def member_config(cfg: Any, index: int) -> Any:
    """The run's config as the single-dataset run of entry `index` would have it (what `data.dataset` reads)."""
    entry = cfg.data.mixture[index]
    per = {key: getattr(entry, key) for key in PER_DATASET}
    data = dataclasses.replace(cfg.data, mixture=None, **per)
    return dataclasses.replace(cfg, data=data)


def member_of(cfg: Any, dataset: str | Path) -> tuple[Any, str]:
    """For a mixture run's checkpoint read on one dataset (infer): the entry's single-dataset config and its
    dataset_meta/ subfolder; the entry whose dataset is `dataset` (same folder), else DataError listing them."""
    wanted = Path(dataset).resolve()
    for i, entry in enumerate(cfg.data.mixture):
        if Path(entry.dataset).resolve() == wanted:
            return member_config(cfg, i), f"{i}-{entry.label}"
    listed = ", ".join(entry.dataset for entry in cfg.data.mixture)
    raise DataError(
        f"{dataset} is none of the datasets this mixture checkpoint was trained on ({listed}): each normalizes "
        "with its own statistics; pass one of them"
    )


def member_error(err: Exception, index: int, entry: MixtureEntry) -> Exception:
    """An error of a member's single-dataset view, re-pointed at its mixture entry."""
    where = f"data.mixture[{index}]"
    if isinstance(err, ConfigError) and err.field.startswith("data."):
        return ConfigError(f"{where}.{err.field.removeprefix('data.')}", err.reason)
    text = re.sub(r"\bdata\.(" + "|".join(PER_DATASET) + r")\b", rf"{where}.\1", str(err))
    return DataError(f"{where} ({entry.label}): {text}")


def mixture_fingerprint(entries: list[MixtureEntry]) -> dict[str, Any] | None:
    """Every member's dataset fingerprint in one (`data.fingerprint`'s form), its paths under
    `<index>-<label>/`, so a resume names the member and file that changed. None if a member has no meta/."""
    from .fingerprint import fingerprint

    out: dict[str, Any] = {"meta": {}, "files": {}}
    for i, entry in enumerate(entries):
        found = fingerprint(entry.dataset)
        if found is None:
            return None
        for kind in ("meta", "files"):
            out[kind].update({f"{i}-{entry.label}/{path}": value for path, value in found[kind].items()})
    return out


def run_fingerprint(cfg: Any) -> dict[str, Any] | None:
    """The fingerprint a checkpoint records of the run's data: the dataset's, or every mixture member's."""
    from .fingerprint import fingerprint

    if cfg.data.mixture:
        return mixture_fingerprint(cfg.data.mixture)
    return fingerprint(cfg.data.dataset) if cfg.data.dataset else None
