"""The data component: where a run's batches come from and how a step takes them.

`build_source` turns an opened dataset (`data.dataset.open_dataset`) and the model's processor into the BatchSource
that `optimizations.data` names: vla-io's Pipeline (`async`: worker processes decode, a host thread runs the
processor, a copy stream moves batches to the device, where images are prepared; `sync`: the same in the
training thread) or the LeRobot-style baseline of the ablation ladder (`dataloader`, `_baselines.py`).
`DataComponent` is what the Trainer holds: it takes one step's microbatches from any BatchSource (timed as
`data_wait`, plus the work the source timed itself, `h2d`) and carries the source's position into
checkpoints."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from .._distributed import DistEnv
from .._errors import DataError
from .._parts import Batch, BatchSource
from ..config.sections import TrainConfig
from ..metrics.timing import StepTimer
from . import dataset as _data

log = logging.getLogger(__name__)


class DataComponent:
    """A step's microbatches from the run's BatchSource, and the source's position for checkpoints."""

    def __init__(self, source: BatchSource, microbatches: int) -> None:
        self.source = source
        self.microbatches = microbatches
        """Microbatches per optimizer step (optim.grad_accum)."""

    def next_step(self, timer: StepTimer) -> list[Batch]:
        """The next step's microbatches, on the training device. The wait is timed as `data_wait` (the GPU
        idle for want of a batch); the source's own timings (`h2d`, on its thread) are added."""
        with timer.phase("data_wait"):
            microbatches = [next(self.source) for _ in range(self.microbatches)]
        for name, seconds in self.source.timings().items():
            timer.add(name, seconds)
        return microbatches

    def state_dict(self) -> dict[str, Any]:
        """The source's position after the last batch taken (what a resume continues from)."""
        return self.source.state_dict()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue from a position `state_dict` returned."""
        self.source.load_state_dict(state)

    def close(self) -> None:
        """Stop the source's background work."""
        self.source.close()


def build_source(
    cfg: TrainConfig, env: DistEnv, data, processor, check_first: Callable[[Batch], None] | None = None,
    **mixture: Any,
) -> BatchSource:  # fmt: skip
    """The BatchSource of `optimizations.data` over `data` (a `data.dataset.TrainingData`), with `processor` (the
    model's) turning samples into model inputs; `check_first` sees the first batch. A mixture
    (`model.build_mixture`) passes its own `dataset`, host `transform` and `wrap_images` (around the image step)."""
    if cfg.optimizations.data == "dataloader":  # the ablation ladder's first row
        from .._baselines import LeRobotStyleSource

        return LeRobotStyleSource(cfg, data, processor, env, check_first=check_first)
    return _data.PipelineSource(_pipeline(cfg, env, data, processor, **mixture), check_first=check_first)


def _pipeline(
    cfg: TrainConfig, env: DistEnv, data, processor, dataset=None, transform=None, wrap_images=None
):  # fmt: skip
    """vla-io's pipeline: workers decode, the processor runs on the host thread, augmentation on the device."""
    import vla_io

    augment = _data.image_transform(
        processor, len(data.camera_keys), augment=cfg.data.augment, backend=cfg.data.augment_backend
    )
    dataset = data.dataset if dataset is None else dataset
    pipeline = vla_io.Pipeline(
        dataset,
        cfg.data.batch_size,
        transform=_data.host_transform(data, processor) if transform is None else transform,
        device_transform=augment if wrap_images is None else wrap_images(augment),
        num_workers=cfg.data.num_workers,
        prefetch_per_worker=cfg.data.prefetch,
        seed=cfg.seed,
        rank=env.rank,
        world_size=env.world_size,
        shuffle=cfg.data.shuffle,
        device=str(env.device),
        synchronous=cfg.optimizations.data == "sync",
        timeout_s=cfg.data.worker_timeout_s,
        skip_bad_samples=True,  # counted against data.max_bad_fraction by the loop
        **({"start_method": "spawn"} if cfg.data.decode_device == "cuda" else {}),
    )
    if len(pipeline) == 0:
        pipeline.close()
        raise DataError(
            f"data.batch_size: dataset {data.root} has {len(dataset)} samples, fewer than one batch of "
            f"{cfg.data.batch_size} per rank on {env.world_size} rank(s)"
        )
    log.info(
        "images prepared on %s with the %s backend", pipeline.device, augment.backend_for(pipeline.device)
    )
    return pipeline
