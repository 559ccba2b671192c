"""Named runs as Python functions (a file or `--set` overrides start from one of these)."""

from __future__ import annotations

from collections.abc import Callable

from .._errors import ConfigError
from .sections import (
    CheckpointConfig,
    DataConfig,
    LoggingConfig,
    ModelConfig,
    OptimConfig,
    OptimizationsConfig,
    TrainConfig,
)


def demo_config() -> TrainConfig:
    """The CPU demo: the `tiny` model on a small synthetic LIBERO-like dataset, full async pipeline,
    a few hundred steps in a few minutes on 2 cores (on a GPU machine the same settings run on the GPU)."""
    return TrainConfig(
        steps=600,
        output_dir="runs/demo",
        data=DataConfig(
            cameras=["image", "wrist_image"],
            embodiment_tag="libero_panda",
            batch_size=16,
            num_workers=1,
            augment=False,
        ),
        model=ModelConfig(preset="tiny"),
        optim=OptimConfig(lr=3e-3, warmup_ratio=0.05, weight_decay=0.0),
        # eager and unsharded on every device: the demo shows the loop, it does not wait for graph capture
        optimizations=OptimizationsConfig(comm="overlap", graph="eager"),
        checkpoint=CheckpointConfig(every=0, keep_last=2),
        logging=LoggingConfig(every=10, summary_skip=10),
    )


def libero_config() -> TrainConfig:
    """The LIBERO-like benchmark setting: the full `n1.6-3b` model, batch 16 per GPU, two 256x256 cameras,
    8-d state, 7-d action; the optimizer and every speed switch as the defaults have them."""
    return TrainConfig(
        steps=20_000,
        output_dir="runs/libero",
        data=DataConfig(
            cameras=["image", "wrist_image"],
            embodiment_tag="libero_panda",
            action_horizon=16,
            batch_size=16,
            num_workers=8,
            augment=True,
        ),
        model=ModelConfig(preset="n1.6-3b"),
        checkpoint=CheckpointConfig(every=2_000, keep_last=3),
    )


PRESETS: dict[str, Callable[[], TrainConfig]] = {"demo": demo_config, "libero": libero_config}


def preset_config(name: str) -> TrainConfig:
    """A fresh copy of the named preset."""
    if name not in PRESETS:
        raise ConfigError(
            "preset", f"{name!r} is not one of the allowed values: {', '.join(sorted(PRESETS))}"
        )
    return PRESETS[name]()
