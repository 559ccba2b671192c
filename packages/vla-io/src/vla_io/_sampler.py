"""Deterministic, resumable, distributed sample order: a pure function of (seed, epoch, rank)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

_MASK = np.uint64(0xFFFFFFFFFFFFFFFF)


def mix64(x: np.ndarray) -> np.ndarray:
    """splitmix64 finalizer: well-spread 64-bit values from consecutive inputs."""
    x = x.astype(np.uint64)
    with np.errstate(over="ignore"):
        x = (x + np.uint64(0x9E3779B97F4A7C15)) & _MASK
        x = ((x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)) & _MASK
        x = ((x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)) & _MASK
        return x ^ (x >> np.uint64(31))


@dataclass(frozen=True)
class BatchTask:
    """One batch to load: where it sits in the stream, which samples, and each sample's seed."""

    epoch: int
    batch: int
    indices: np.ndarray
    seeds: np.ndarray

    @property
    def tag(self) -> tuple[int, int]:
        """(epoch, batch) of this task."""
        return (self.epoch, self.batch)

    def subset(self, positions: np.ndarray) -> BatchTask:
        """The same task restricted to some of its samples."""
        return BatchTask(self.epoch, self.batch, self.indices[positions], self.seeds[positions])


class EpochSampler:
    """Each epoch: a permutation of all samples (seeded by seed and epoch), split across ranks, batched.

    Rank r takes every world_size-th sample of the epoch's order starting at r. With `drop_last` the tail
    that does not fill every rank equally and the last partial batch are dropped; otherwise ranks are padded
    by wrapping around and the last batch may be smaller. A sample's seed depends on (seed, epoch, its place
    in the epoch's global order) only, so augmentation does not change with world size or batching.
    """

    def __init__(
        self, num_samples: int, batch_size: int, *, seed: int = 0, rank: int = 0, world_size: int = 1,
        shuffle: bool = True, drop_last: bool = True,
    ) -> None:  # fmt: skip
        if not 0 <= rank < world_size:
            raise ValueError(f"rank must be in [0, world_size={world_size}), got {rank}")
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        self.num_samples, self.batch_size, self.seed = num_samples, batch_size, seed
        self.rank, self.world_size, self.shuffle, self.drop_last = rank, world_size, shuffle, drop_last
        if drop_last:
            self.per_rank = num_samples // world_size
            self.batches_per_epoch = self.per_rank // batch_size
        else:
            self.per_rank = -(-num_samples // world_size)
            self.batches_per_epoch = -(-self.per_rank // batch_size)
        if self.batches_per_epoch == 0:
            raise ValueError(
                f"no full batch: {num_samples} samples over {world_size} ranks at batch size {batch_size}"
            )

    def order(self, epoch: int) -> np.ndarray:
        """The epoch's global sample order."""
        if not self.shuffle:
            return np.arange(self.num_samples)
        return np.random.default_rng([self.seed & 0xFFFFFFFF, epoch, 0xA11CE]).permutation(self.num_samples)

    def rank_positions(self, epoch: int) -> np.ndarray:
        """Places in the epoch's global order that this rank loads, in its own order."""
        total = self.per_rank * self.world_size
        positions = np.arange(total) % self.num_samples  # wraps around only when padding
        return positions[self.rank :: self.world_size][: self.per_rank]

    def task(self, epoch: int, batch: int) -> BatchTask:
        """The `batch`-th batch of `epoch` for this rank."""
        if not 0 <= batch < self.batches_per_epoch:
            raise IndexError(f"batch {batch} outside [0, {self.batches_per_epoch})")
        positions = self.rank_positions(epoch)[batch * self.batch_size : (batch + 1) * self.batch_size]
        order = self.order(epoch)
        key = (np.uint64(self.seed & 0xFFFFFFFF) << np.uint64(32)) ^ np.uint64(epoch)
        seeds = mix64(mix64(np.full(len(positions), key, dtype=np.uint64)) ^ positions.astype(np.uint64))
        return BatchTask(epoch, batch, order[positions], (seeds >> np.uint64(1)).astype(np.int64))

    def tasks(self, epoch: int, batch: int):
        """Every task from (epoch, batch) on, across epochs, forever."""
        while True:
            while batch < self.batches_per_epoch:
                yield self.task(epoch, batch)
                batch += 1
            epoch, batch = epoch + 1, 0
