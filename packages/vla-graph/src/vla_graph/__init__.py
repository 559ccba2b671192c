"""vla-graph: graph-safe CUDA Graph capture of a training step (eager, full_iteration, per_microbatch).

See the package README for the API and a runnable example."""

from .__about__ import __version__
from ._check import Finding, check_graph_safe
from ._config import GraphConfig
from ._device import capture_stream
from ._errors import GraphCaptureError, ShapeChangeError
from ._padding import bucket_size, masked_mean, pad_batch, pad_dim, pad_sequences
from ._random import RandomDraws, RandomSpec
from ._static import StaticInputs
from ._step import GraphedStep, GraphReport
from ._sync import GradSync

__all__ = [
    "Finding",
    "GraphCaptureError",
    "GraphConfig",
    "GraphReport",
    "GradSync",
    "GraphedStep",
    "RandomDraws",
    "RandomSpec",
    "ShapeChangeError",
    "StaticInputs",
    "__version__",
    "bucket_size",
    "capture_stream",
    "check_graph_safe",
    "masked_mean",
    "pad_batch",
    "pad_dim",
    "pad_sequences",
]
