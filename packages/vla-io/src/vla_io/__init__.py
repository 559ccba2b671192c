"""vla-io: LeRobot datasets (parquet + mp4), fast frame decoding, batched image transforms and a three-level
async pipeline that keeps the GPU fed. See the package README for a tour.

`import vla_io` is cheap: names are imported from their modules on first use.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from .__about__ import __version__

_EXPORTS = {
    "LeRobotDataset": "._dataset",
    "DatasetMeta": "._meta",
    "Episode": "._meta",
    "VideoSpan": "._meta",
    "Modality": "._modality",
    "ModalityEntry": "._modality",
    "Pipeline": "._pipeline",
    "PipelineConfig": "._pipeline_config",
    "EpochSampler": "._sampler",
    "collate": "._collate",
    "ImageAugment": "._augment",
    "ImageTransformConfig": "._augment_params",
    "ImageParams": "._augment_params",
    "sample_params": "._augment_params",
    "available_backends": "._decode",
    "open_reader": "._decode",
    "FrameCache": "._cache",
    "dataset_stats": "._dataset_stats",
    "user_cache_dir": "._user_cache",
    "SynthConfig": "._synth",
    "SYNTH_PRESETS": "._synth",
    "write_synthetic_dataset": "._synth",
    "read_frame_marker": "._synth",
    "VlaIoError": "._errors",
    "DatasetFormatError": "._errors",
    "VideoDecodeError": "._errors",
    "FrameTimestampError": "._errors",
    "WorkerError": "._errors",
    "WorkerTimeoutError": "._errors",
    "MissingExtraError": "._errors",
    "check_dataset": "._check",
}
_ALIASES = {"SYNTH_PRESETS": "PRESETS"}

__all__ = [
    "__version__",
    "DatasetFormatError",
    "DatasetMeta",
    "Episode",
    "EpochSampler",
    "FrameCache",
    "FrameTimestampError",
    "ImageAugment",
    "ImageParams",
    "ImageTransformConfig",
    "LeRobotDataset",
    "MissingExtraError",
    "Modality",
    "ModalityEntry",
    "Pipeline",
    "PipelineConfig",
    "SYNTH_PRESETS",
    "SynthConfig",
    "VideoDecodeError",
    "VideoSpan",
    "VlaIoError",
    "WorkerError",
    "WorkerTimeoutError",
    "available_backends",
    "check_dataset",
    "collate",
    "dataset_stats",
    "open_reader",
    "read_frame_marker",
    "sample_params",
    "user_cache_dir",
    "write_synthetic_dataset",
]


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'vla_io' has no attribute {name!r}")
    value = getattr(importlib.import_module(module, __name__), _ALIASES.get(name, name))
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(__all__)


if TYPE_CHECKING:
    from ._augment import ImageAugment
    from ._augment_params import ImageParams, ImageTransformConfig, sample_params
    from ._cache import FrameCache
    from ._check import check_dataset
    from ._collate import collate
    from ._dataset import LeRobotDataset
    from ._dataset_stats import dataset_stats
    from ._decode import available_backends, open_reader
    from ._errors import (
        DatasetFormatError,
        FrameTimestampError,
        MissingExtraError,
        VideoDecodeError,
        VlaIoError,
        WorkerError,
        WorkerTimeoutError,
    )
    from ._meta import DatasetMeta, Episode, VideoSpan
    from ._modality import Modality, ModalityEntry
    from ._pipeline import Pipeline
    from ._pipeline_config import PipelineConfig
    from ._sampler import EpochSampler
    from ._synth import PRESETS as SYNTH_PRESETS
    from ._synth import SynthConfig, read_frame_marker, write_synthetic_dataset
    from ._user_cache import user_cache_dir
