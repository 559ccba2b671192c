"""gr00t-train: the GR00T N1.6 trainer and the `gr00t-train` CLI, wiring vla-io, vla-overlap, vla-graph and
gr00t-model together. See the package README ("How it is built"); the loop and the step are in `_trainer.py`."""

from .__about__ import __version__
from ._checkpoint import Checkpointer
from ._config import (
    CheckpointConfig,
    DataConfig,
    LoggingConfig,
    ModelConfig,
    OptimConfig,
    OptimizationsConfig,
    TrainConfig,
)
from ._config_io import apply_overrides, config_from_dict, config_to_dict, load_config
from ._distributed import DistEnv, init_distributed, shutdown_distributed
from ._errors import (
    BatchTooLargeError,
    CheckpointError,
    ConfigError,
    DataError,
    NonFiniteLossError,
    NonFiniteWeightsError,
    RunFolderError,
    TrainingInterrupted,
)
from ._infer import EvalReport, evaluate
from ._metrics import RunSummary, StepRecord
from ._parts import BatchSource, TrainParts
from ._presets import PRESETS, demo_config, libero_config
from ._run import run_training
from ._schedule import CosineSchedule
from ._trainer import Trainer

__all__ = [
    "PRESETS",
    "BatchSource",
    "BatchTooLargeError",
    "CheckpointConfig",
    "CheckpointError",
    "Checkpointer",
    "ConfigError",
    "CosineSchedule",
    "DataConfig",
    "DataError",
    "DistEnv",
    "EvalReport",
    "LoggingConfig",
    "ModelConfig",
    "NonFiniteLossError",
    "NonFiniteWeightsError",
    "OptimConfig",
    "OptimizationsConfig",
    "RunFolderError",
    "RunSummary",
    "StepRecord",
    "TrainConfig",
    "TrainParts",
    "Trainer",
    "TrainingInterrupted",
    "__version__",
    "apply_overrides",
    "config_from_dict",
    "config_to_dict",
    "demo_config",
    "evaluate",
    "init_distributed",
    "libero_config",
    "load_config",
    "run_training",
    "shutdown_distributed",
]
