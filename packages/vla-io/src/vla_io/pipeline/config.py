"""`PipelineConfig`: every knob of `Pipeline`, validated on construction."""

from __future__ import annotations

import multiprocessing
from dataclasses import dataclass, field

START_METHODS = ("fork", "spawn", "forkserver")


def _default_start_method() -> str:
    # fork starts workers in milliseconds and shares the dataset's arrays copy-on-write
    return "fork" if "fork" in multiprocessing.get_all_start_methods() else "spawn"


@dataclass(kw_only=True)
class PipelineConfig:
    """How `Pipeline` loads, orders and delivers batches."""

    batch_size: int
    """Samples per batch (per rank)."""
    num_workers: int = 2
    """Level-1 worker processes that decode and collate; 0 loads in the pipeline's own host thread."""
    seed: int = 0
    """Seed of the sample order (per epoch) and of each sample's `sample_seed`."""
    rank: int = 0
    """This process's rank among `world_size` data-parallel ranks."""
    world_size: int = 1
    """Number of data-parallel ranks; each loads a disjoint 1/world_size of every epoch."""
    shuffle: bool = True
    """Permute samples each epoch (else dataset order)."""
    drop_last: bool = True
    """Drop samples that would make ranks unequal and the last partial batch (fixed shapes)."""
    sample_window: int = 1
    """Shuffle windows of this many consecutive frames of an episode instead of single samples (1: a
    uniform shuffle, the default). A worker then decodes each window forward instead of seeking: on
    LIBERO-like AV1 (a keyframe every 2 frames) 2 / 4 / 8 cut decoding CPU by about 20 / 33 / 40 %. The
    price: a batch holds runs of neighbouring, nearly identical frames. Needs `dataset.episode_bounds()`."""
    prefetch_per_worker: int = 2
    """Level 1 loads num_workers * prefetch_per_worker batches ahead of the host thread."""
    affinity: bool | None = None
    """Split batches across workers by `dataset.affinity(indices)` (LeRobotDataset: the episode), so each
    worker decodes only its own files and keeps their decoders open. None (auto): when the dataset says it
    helps (`dataset.prefers_affinity()`: more video files than one worker keeps open); else each batch goes
    whole to one worker."""
    reuse_shared_memory: bool = True
    """Workers reuse a batch's shared memory once the main process has copied it out (into pinned memory
    for CUDA, a private copy on CPU): fresh shared memory costs a page fault per 4 KB in the workers."""
    pin_shared_memory: bool = True
    """On CUDA, page-lock the workers' reused shared memory once (cudaHostRegister) and copy batches to the
    device straight from it, instead of through a staging copy into pinned buffers (a host memcpy of every
    batch on the copy thread). Needs `reuse_shared_memory`; falls back to staging if registering fails."""
    host_buffers: int = 2
    """Level 2: transformed batches kept ready (2 = a double buffer)."""
    device_buffers: int = 2
    """Level 3: batches in flight to, or waiting on, the device."""
    device: str = "auto"
    """Where batches are delivered: "auto" (CUDA if available), "cpu" or "cuda[:i]"."""
    start_method: str = field(default_factory=_default_start_method)
    """Worker start method: "fork" (default on Linux), "spawn" or "forkserver"."""
    image_dtype: str | None = "uint8"
    """Frame dtype workers produce; uint8 moves 4x fewer bytes (convert on the device). None: the dataset's."""
    synchronous: bool = False
    """Do everything in the caller's thread, in the same order: the baseline and the reference for tests."""
    timeout_s: float = 300.0
    """Raise if one batch takes longer than this to load."""
    skip_bad_samples: bool = False
    """Replace a sample that cannot be decoded (corrupt or truncated video) by another one, with a warning
    per episode, instead of failing the batch; `Pipeline.state_dict()["skipped_samples"]` counts them."""

    def __post_init__(self) -> None:
        positive = (
            "batch_size",
            "world_size",
            "prefetch_per_worker",
            "host_buffers",
            "device_buffers",
            "sample_window",
        )
        for name in positive:
            if int(getattr(self, name)) < 1:
                raise ValueError(f"PipelineConfig.{name} must be >= 1, got {getattr(self, name)}")
        if self.num_workers < 0:
            raise ValueError(f"PipelineConfig.num_workers must be >= 0, got {self.num_workers}")
        if not 0 <= self.rank < self.world_size:
            raise ValueError(
                f"PipelineConfig.rank must be in [0, world_size={self.world_size}), got {self.rank}"
            )
        if self.start_method not in START_METHODS:
            raise ValueError(
                f"PipelineConfig.start_method must be one of {START_METHODS}, got {self.start_method!r}"
            )
        if self.image_dtype not in (None, "uint8", "float32"):
            raise ValueError(
                f"PipelineConfig.image_dtype must be None, 'uint8' or 'float32', got {self.image_dtype!r}"
            )
        if self.timeout_s <= 0:
            raise ValueError(f"PipelineConfig.timeout_s must be > 0, got {self.timeout_s}")
