"""LeRobot datasets on disk (v2.0, v2.1, v3.0): metadata, the parquet rows, `meta/modality.json`, feature
statistics, and `LeRobotDataset`, which returns samples and batches with LeRobot's conventions.

Modules: `lerobot` (the dataset), `meta` (info, episodes, tasks, stats files), `table` (parquet rows as
numpy), `modality` (named slices of state/action), `stats` (statistics math and the stats.json shape),
`stats_cache` (`dataset_stats`: metadata, else computed once and cached), `index_check` (episodes missing
from the index), `info` (the `vla-io info` summary), `mixture` (`MixtureDataset`: several datasets, each
with its weight and its own transform to a common layout). Frames are decoded by `vla_io.decode`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .._lazy import lazy_exports

_EXPORTS = {
    "LeRobotDataset": ".lerobot",
    "MixtureDataset": ".mixture",
    "MixtureMember": ".mixture",
    "MIXTURE_KEY": ".mixture",
    "DatasetMeta": ".meta",
    "Episode": ".meta",
    "VideoSpan": ".meta",
    "Modality": ".modality",
    "ModalityEntry": ".modality",
    "dataset_stats": ".stats_cache",
}
__all__ = [
    "DatasetMeta",
    "Episode",
    "LeRobotDataset",
    "MIXTURE_KEY",
    "MixtureDataset",
    "MixtureMember",
    "Modality",
    "ModalityEntry",
    "VideoSpan",
    "dataset_stats",
]
__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)

if TYPE_CHECKING:
    from .lerobot import LeRobotDataset
    from .meta import DatasetMeta, Episode, VideoSpan
    from .mixture import MIXTURE_KEY, MixtureDataset, MixtureMember
    from .modality import Modality, ModalityEntry
    from .stats_cache import dataset_stats
