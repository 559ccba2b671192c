"""vla-io: LeRobot datasets (parquet + mp4), fast frame decoding, batched image transforms and a three-level
async pipeline that keeps the GPU fed. See the package README for a tour.

The names here are what you need to feed your own policy. The package is built from subpackages, one per
job, each with its own `__all__`: `vla_io.dataset` (the LeRobot format), `vla_io.decode` (video readers,
frame cache, whole-dataset check), `vla_io.pipeline` (sampler, workers, host thread, copy to the device),
`vla_io.augment` (image transforms) and `vla_io.testing` (synthetic datasets and other fixtures).

`import vla_io` is cheap: names (and subpackages) are imported on first use.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .__about__ import __version__
from ._lazy import lazy_exports

_EXPORTS = {
    "LeRobotDataset": ".dataset",
    "DatasetMeta": ".dataset",
    "MixtureDataset": ".dataset",
    "MixtureMember": ".dataset",
    "dataset_stats": ".dataset",
    "available_backends": ".decode",
    "open_reader": ".decode",
    "check_dataset": ".decode",
    "Pipeline": ".pipeline",
    "PipelineConfig": ".pipeline",
    "EpochSampler": ".pipeline",
    "collate": ".pipeline",
    "ImageAugment": ".augment",
    "ImageTransformConfig": ".augment",
    "write_synthetic_dataset": ".testing",
    "user_cache_dir": "._user_cache",
    "VlaIoError": "._errors",
    "DatasetFormatError": "._errors",
    "VideoDecodeError": "._errors",
    "FrameTimestampError": "._errors",
    "WorkerError": "._errors",
    "WorkerTimeoutError": "._errors",
    "MissingExtraError": "._errors",
}
_SUBPACKAGES = ("augment", "dataset", "decode", "pipeline", "testing")
_MOVED = {  # left the top level in 0.3.0; still found here, with a DeprecationWarning, until 0.4.0
    "Episode": ".dataset",
    "VideoSpan": ".dataset",
    "Modality": ".dataset",
    "ModalityEntry": ".dataset",
    "FrameCache": ".decode",
    "ImageParams": ".augment",
    "sample_params": ".augment",
    "SynthConfig": ".testing",
    "SYNTH_PRESETS": ".testing",
    "read_frame_marker": ".testing",
}

__all__ = [
    "__version__",
    "DatasetFormatError",
    "DatasetMeta",
    "EpochSampler",
    "FrameTimestampError",
    "ImageAugment",
    "ImageTransformConfig",
    "LeRobotDataset",
    "MissingExtraError",
    "MixtureDataset",
    "MixtureMember",
    "Pipeline",
    "PipelineConfig",
    "VideoDecodeError",
    "VlaIoError",
    "WorkerError",
    "WorkerTimeoutError",
    "available_backends",
    "check_dataset",
    "collate",
    "dataset_stats",
    "open_reader",
    "user_cache_dir",
    "write_synthetic_dataset",
]
__getattr__, __dir__ = lazy_exports(
    __name__, _EXPORTS, subpackages=_SUBPACKAGES, moved=_MOVED, removal="vla-io 0.4.0"
)

if TYPE_CHECKING:
    # subpackages, imported on first attribute access
    from . import augment as augment
    from . import dataset as dataset
    from . import decode as decode
    from . import pipeline as pipeline
    from . import testing as testing
    from ._errors import (
        DatasetFormatError,
        FrameTimestampError,
        MissingExtraError,
        VideoDecodeError,
        VlaIoError,
        WorkerError,
        WorkerTimeoutError,
    )
    from ._user_cache import user_cache_dir
    from .augment import ImageAugment, ImageTransformConfig
    from .dataset import DatasetMeta, LeRobotDataset, MixtureDataset, MixtureMember, dataset_stats
    from .decode import available_backends, check_dataset, open_reader
    from .pipeline import EpochSampler, Pipeline, PipelineConfig, collate
    from .testing import write_synthetic_dataset
