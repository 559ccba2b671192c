"""gr00t-train: the GR00T N1.6 trainer and the `gr00t-train` CLI, wiring vla-io, vla-overlap, vla-graph and
gr00t-model together. See the package README ("How it is built"); the loop and the step are in `_trainer.py`.

`import gr00t_train` is cheap: names are imported from their modules on first use, so the command line
starts, and answers a bad setting, without loading torch first."""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from .__about__ import __version__

_EXPORTS = {
    "Checkpointer": ".checkpoint.checkpointer",
    "CheckpointConfig": ".config.sections",
    "DataConfig": ".config.sections",
    "EvalConfig": ".config.sections",
    "LoRAConfig": ".config.sections",
    "MemoryConfig": ".config.sections",
    "LoggingConfig": ".config.sections",
    "ModelConfig": ".config.sections",
    "OptimConfig": ".config.sections",
    "OptimizationsConfig": ".config.sections",
    "PrefixCacheConfig": ".prefix_cache.config",
    "TrainConfig": ".config.sections",
    "apply_overrides": ".config.io",
    "config_from_dict": ".config.io",
    "config_to_dict": ".config.io",
    "load_config": ".config.io",
    "DistEnv": "._distributed",
    "init_distributed": "._distributed",
    "shutdown_distributed": "._distributed",
    "BatchTooLargeError": "._errors",
    "CheckpointError": "._errors",
    "ConfigError": "._errors",
    "DataError": "._errors",
    "NonFiniteLossError": "._errors",
    "NonFiniteWeightsError": "._errors",
    "RunFolderError": "._errors",
    "TrainingInterrupted": "._errors",
    "EvalReport": ".validation.infer",
    "evaluate": ".validation.infer",
    "RunSummary": ".metrics.records",
    "StepRecord": ".metrics.records",
    "BatchSource": "._parts",
    "TrainParts": "._parts",
    "PRESETS": ".config.presets",
    "demo_config": ".config.presets",
    "libero_config": ".config.presets",
    "run_training": "._run",
    "CosineSchedule": "._schedule",
    "Trainer": "._trainer",
}

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
    "EvalConfig",
    "EvalReport",
    "LoRAConfig",
    "LoggingConfig",
    "MemoryConfig",
    "ModelConfig",
    "NonFiniteLossError",
    "NonFiniteWeightsError",
    "OptimConfig",
    "OptimizationsConfig",
    "PrefixCacheConfig",
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


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        if name.startswith("_") and not name.startswith("__"):  # a private module, as `gr00t_train._run`
            try:
                return importlib.import_module(f".{name}", __name__)
            except ModuleNotFoundError:
                pass
        raise AttributeError(f"module 'gr00t_train' has no attribute {name!r}")
    value = getattr(importlib.import_module(module, __name__), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(__all__)


if TYPE_CHECKING:
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
    from ._parts import BatchSource, TrainParts
    from ._run import run_training
    from ._schedule import CosineSchedule
    from ._trainer import Trainer
    from .checkpoint.checkpointer import Checkpointer
    from .config.io import apply_overrides, config_from_dict, config_to_dict, load_config
    from .config.presets import PRESETS, demo_config, libero_config
    from .config.sections import (
        CheckpointConfig,
        DataConfig,
        EvalConfig,
        LoggingConfig,
        LoRAConfig,
        MemoryConfig,
        ModelConfig,
        OptimConfig,
        OptimizationsConfig,
        TrainConfig,
    )
    from .metrics.records import RunSummary, StepRecord
    from .prefix_cache.config import PrefixCacheConfig
    from .validation.infer import EvalReport, evaluate
