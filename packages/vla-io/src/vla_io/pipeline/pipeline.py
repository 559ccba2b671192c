"""`Pipeline`: three asynchronous levels between a dataset and the training step.

L1 worker processes load batches (decode + collate into shared memory; `level1_workers`); L2, a host
thread, runs the caller's `transform` (e.g. a model processor) into a double buffer (`level2_host`); L3, a
copy thread, moves batches through pinned buffers on a dedicated CUDA stream and runs the optional
`device_transform` (e.g. GPU augmentation) there (`level3_device`); the consumer's stream waits on an
event, never the host. `producer` starts and stops the three levels. Each level records how long
its consumer waited on it. The order is a pure function of (seed, epoch, rank), so `state_dict()` resumes
exactly, and `synchronous=True` produces the same batches in the caller's thread. A state saved at another
world size or batch size continues at the same place of the epoch's global order (`load_state_dict`).
"""

from __future__ import annotations

import dataclasses
import logging
import threading
import time
import weakref
from collections.abc import Callable, Iterator, Mapping
from typing import Any

from .config import PipelineConfig
from .handoff import WaitStats
from .level1_workers import load_batch
from .level3_device import HostToDevice, hand_over, pipeline_device, to_device
from .producer import Producer
from .sampler import EpochSampler
from .skips import SkipLog

log = logging.getLogger(__name__)
Batch = dict[str, Any]
_STATE_FIELDS = ("seed", "num_samples", "shuffle", "drop_last", "sample_window", "sampler")
"""What a saved state must share with the pipeline that loads it (world size and batch size may differ)."""


class _Background:
    """The threads and workers a Pipeline runs. Stopped by `Pipeline.close()`, when the Pipeline is garbage
    collected, and at interpreter exit (a `weakref.finalize`): a daemon thread still inside a torch op when
    Python shuts down is killed there, which aborts the process ("terminate called without an active
    exception"). The finalizer holds this object, never the Pipeline, so the Pipeline stays collectable."""

    def __init__(self) -> None:
        self.producer: Producer | None = None
        self.lock = threading.Lock()

    def stop(self) -> None:
        with self.lock:
            producer, self.producer = self.producer, None
        if producer is not None:
            producer.close()


class Pipeline:
    """Batches of `dataset`, delivered on `device`, one epoch per iteration.

    ```python
    with Pipeline(dataset, batch_size=16, transform=processor, device_transform=augment,
                  num_workers=8, seed=0, rank=rank, world_size=world_size) as pipe:
        for batch in pipe:       # one epoch; the next `for` continues with the next epoch
            loss = model(**batch)
    ```
    `dataset` needs `__len__` and `get_batch(indices)` (like `LeRobotDataset`) or `__getitem__`.
    Every batch carries `sample_seed` (int64, one per sample) for reproducible random augmentation.
    Background threads and workers stop on `close()` (or leaving the `with` block), when the pipeline is
    garbage collected, or at interpreter exit.
    """

    def __init__(
        self,
        dataset: Any,
        batch_size: int | None = None,
        *,
        transform: Callable[[Batch], Mapping[str, Any]] | None = None,
        device_transform: Callable[[Batch], Mapping[str, Any]] | None = None,
        config: PipelineConfig | None = None,
        **options: Any,
    ) -> None:
        if config is None:
            if batch_size is None:
                raise TypeError("Pipeline needs batch_size (or a PipelineConfig)")
            config = PipelineConfig(batch_size=batch_size, **options)
        elif batch_size is not None or options:
            config = dataclasses.replace(
                config, **({"batch_size": batch_size} if batch_size else {}), **options
            )
        self.config, self.dataset = config, dataset
        self.transform, self.device_transform = transform, device_transform
        own_order = hasattr(dataset, "epoch_sampler")  # a dataset with its own order (MixtureDataset)
        if own_order and config.sample_window > 1:
            raise ValueError(f"PipelineConfig.sample_window > 1 is not supported by {type(dataset).__name__}")
        bounds = None
        if config.sample_window > 1:
            if not hasattr(dataset, "episode_bounds"):
                raise ValueError("PipelineConfig.sample_window > 1 needs a dataset with episode_bounds()")
            bounds = dataset.episode_bounds()
        options = dict(
            seed=config.seed, rank=config.rank, world_size=config.world_size, shuffle=config.shuffle,
            drop_last=config.drop_last,
        )  # fmt: skip
        if own_order:
            self.sampler = dataset.epoch_sampler(config.batch_size, **options)
        else:
            self.sampler = EpochSampler(
                len(dataset), config.batch_size, window=config.sample_window, bounds=bounds, **options
            )
        self.device = pipeline_device(config.device)
        decode_device = str(getattr(dataset, "decode_device", "cpu"))
        if (
            decode_device != "cpu"
            and config.num_workers > 0
            and config.start_method == "fork"
            and not config.synchronous
        ):
            raise ValueError(
                f"the dataset decodes on {decode_device!r}: CUDA cannot be used in forked workers; set "
                "PipelineConfig.start_method='spawn' (or num_workers=0 to decode in the pipeline's host thread)"
            )
        self._epoch, self._batch = 0, 0
        self._stats = WaitStats()
        self._skips = SkipLog()
        self._background = _Background()
        self._finalizer = weakref.finalize(self, self._background.stop)

    # -- iteration ------------------------------------------------------------------------------------
    def __len__(self) -> int:
        """Batches per epoch on this rank."""
        return self.sampler.batches_per_epoch

    @property
    def epoch(self) -> int:
        """The epoch the next batch belongs to."""
        return self._epoch

    def __iter__(self) -> Iterator[Batch]:
        """The rest of the current epoch. Prefetching runs on across the epoch boundary (no bubble)."""
        epoch = self._epoch
        while self._epoch == epoch:
            if self.config.synchronous:
                batch = self._load_sync()
            else:
                tag, batch, event = self._ensure_producer().next(self._stats)
                if tag != (self._epoch, self._batch):
                    raise RuntimeError(
                        f"pipeline delivered batch {tag}, expected {(self._epoch, self._batch)}"
                    )
                batch = hand_over(batch, event, self.device)
                self._skips.deliver(tag)
            self._advance()
            yield batch

    def _advance(self) -> None:
        self._batch += 1
        if self._batch == self.sampler.batches_in(self._epoch):
            self._epoch, self._batch = self._epoch + 1, 0
        self._stats.batches += 1

    def _load_sync(self) -> Batch:
        task = self.sampler.task(self._epoch, self._batch)
        start = time.perf_counter()
        batch = load_batch(self.dataset, task, self.config.image_dtype, False, self.config.skip_bad_samples)
        self._skips.take(batch, task.tag)
        self._skips.deliver(task.tag)
        self._stats.add("l1_wait", time.perf_counter() - start)
        if self.transform is not None:
            start = time.perf_counter()
            batch = dict(self.transform(batch))
            self._stats.add("transform", time.perf_counter() - start)
        start = time.perf_counter()
        batch = to_device(batch, self.device)
        if self.device_transform is not None:
            batch = dict(self.device_transform(batch))
        self._stats.add("device", time.perf_counter() - start)
        return batch

    @property
    def _producer(self) -> Producer | None:
        """The running background levels, if any (tests and benchmarks inspect them)."""
        return self._background.producer

    def _ensure_producer(self) -> Producer:
        background = self._background
        with background.lock:
            if background.producer is None:
                background.producer = Producer(
                    self.dataset, self.sampler, self.config, (self._epoch, self._batch),
                    transform=self.transform, device_transform=self.device_transform,
                    h2d=HostToDevice(self.device, self.config.device_buffers + 2), stats=self._stats,
                    skips=self._skips,
                )  # fmt: skip
            return background.producer

    # -- checkpointing --------------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        """Position in the stream (the next batch to deliver) plus what must match on resume. `consumed` is
        the same position in world-size independent terms: the places of the epoch's global order that every
        rank together has taken (`epoch_start`: where this epoch began, when it was resumed mid-way)."""
        return {
            "epoch": self._epoch,
            "batch": self._batch,
            "epoch_start": self.sampler.epoch_start(self._epoch),
            "consumed": self.sampler.consumed(self._epoch, self._batch),
            "seed": self.config.seed,
            "world_size": self.config.world_size,
            "batch_size": self.config.batch_size,
            "num_samples": self.sampler.num_samples,
            "shuffle": self.config.shuffle,
            "drop_last": self.config.drop_last,
            "sample_window": self.config.sample_window,
            "skipped_samples": self._skips.count,
            **({"sampler": self.sampler.describe()} if hasattr(self.sampler, "describe") else {}),
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Continue from a saved position: the next batch is the one that followed it in the saved run.

        Saved at another world size or batch size, the epoch continues at the same place of its global
        order: the places every rank of the saved run had taken are skipped, and each rank of this pipeline
        takes its share of the rest of that epoch (`EpochSampler.start_epoch_at`); later epochs are dealt
        out as usual. No sample of the epoch is repeated or left out, except a tail shorter than one batch
        on every rank, which `drop_last` leaves out of any epoch."""
        mine = self.state_dict()
        for name in _STATE_FIELDS:
            # a mixture's sizes and weights ("sampler") must match whichever side records them
            if (name in state or name == "sampler") and state.get(name) != mine.get(name):
                raise ValueError(
                    f"Pipeline state has {name}={state.get(name)!r}, this pipeline has {mine.get(name)!r}"
                )
        epoch, batch = int(state["epoch"]), int(state["batch"])
        start = int(state.get("epoch_start", 0))
        same_shape = all(state.get(k, mine[k]) == mine[k] for k in ("world_size", "batch_size"))
        if not same_shape:
            start, batch = self._place_of(state), 0
        self._stop_producer()
        self.sampler.start_epoch_at(epoch, start)
        if not 0 <= batch < self.sampler.batches_in(epoch):
            if same_shape or batch:
                raise ValueError(
                    f"Pipeline state batch {batch} outside [0, {self.sampler.batches_in(epoch)})"
                )
            self.sampler.start_epoch_at(epoch + 1, 0)  # the rest is less than a batch per rank: dropped
            epoch += 1
        self._epoch, self._batch = epoch, batch
        self._skips.forget_pending()
        self._skips.count = int(state.get("skipped_samples", 0))

    def _place_of(self, state: Mapping[str, Any]) -> int:
        """The place of the epoch's global order where a state saved at another world size or batch size
        continues: every place before it was taken by one of the saved run's ranks."""
        window, batch = int(state.get("sample_window", 1)), int(state["batch"])
        taken = batch * int(state["batch_size"])  # per rank
        if window > 1 and taken % window:
            raise ValueError(
                f"Pipeline state at batch {batch} of {state['batch_size']} samples took part of a "
                f"{window}-sample window on each rank: it continues at another world size or batch size only "
                "where each rank took whole windows"
            )
        if "consumed" in state:
            return int(state["consumed"])
        return min(self.sampler.num_samples, taken * int(state["world_size"]))  # before `consumed` existed

    # -- statistics and shutdown ----------------------------------------------------------------------
    def stats(self) -> dict[str, float]:
        """Seconds each level's consumer waited (l1: host thread on workers, l2: copy thread on the host
        thread, l3: you on the copy thread), busy time of transform/device work, batches delivered."""
        return self._stats.summary()

    def reset_stats(self) -> None:
        """Zero the statistics (e.g. after warm-up)."""
        self._stats.reset()

    def _stop_producer(self) -> None:
        self._background.stop()

    def close(self) -> None:
        """Stop threads and workers. Iterating again starts them afresh at the current position."""
        self._stop_producer()

    def __enter__(self) -> Pipeline:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
