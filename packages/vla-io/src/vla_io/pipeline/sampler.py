"""Deterministic, resumable, distributed sample order: a pure function of (seed, epoch, rank)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .._seeds import mix64


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

    With `window` > 1 (needs `bounds`, the [start, end) samples of each episode) the order is a permutation
    of windows of `window` consecutive frames of an episode (edges shifted randomly each epoch), and ranks
    take whole chunks of `window` places, so a worker decodes each window forward instead of seeking.
    """

    def __init__(
        self, num_samples: int, batch_size: int, *, seed: int = 0, rank: int = 0, world_size: int = 1,
        shuffle: bool = True, drop_last: bool = True, window: int = 1, bounds: np.ndarray | None = None,
    ) -> None:  # fmt: skip
        if not 0 <= rank < world_size:
            raise ValueError(f"rank must be in [0, world_size={world_size}), got {rank}")
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        if window < 1:
            raise ValueError(f"window must be >= 1, got {window}")
        if window > 1:
            if bounds is None:
                raise ValueError("a sample window > 1 needs the episode bounds (dataset.episode_bounds())")
            bounds = np.asarray(bounds, dtype=np.int64).reshape(-1, 2)
            if (
                bounds[:, 1].max(initial=0) > num_samples
                or (bounds[:, 1] - bounds[:, 0]).sum() != num_samples
            ):
                raise ValueError(f"episode bounds must cover the {num_samples} samples exactly once")
        self.num_samples, self.batch_size, self.seed = num_samples, batch_size, seed
        self.rank, self.world_size, self.shuffle, self.drop_last = rank, world_size, shuffle, drop_last
        self.window, self.bounds = window, bounds
        self._cache: dict[int, tuple[np.ndarray, np.ndarray]] = {}
        counts = [len(self._places(r)) for r in range(world_size)] if window > 1 else None
        if drop_last:
            self.per_rank = min(counts) if counts else num_samples // world_size
            self.batches_per_epoch = self.per_rank // batch_size
        else:
            self.per_rank = max(counts) if counts else -(-num_samples // world_size)
            self.batches_per_epoch = -(-self.per_rank // batch_size)
        if self.batches_per_epoch == 0:
            raise ValueError(
                f"no full batch: {num_samples} samples over {world_size} ranks at batch size {batch_size}"
            )

    def order(self, epoch: int) -> np.ndarray:
        """The epoch's global sample order."""
        if not self.shuffle:
            return np.arange(self.num_samples)
        rng = np.random.default_rng([self.seed & 0xFFFFFFFF, epoch, 0xA11CE])
        if self.window == 1:
            return rng.permutation(self.num_samples)
        assert self.bounds is not None
        pieces = []
        for start, end in self.bounds.tolist():  # cut each episode at a random phase
            cuts = np.arange(start + int(rng.integers(self.window)), end, self.window)
            edges = np.unique(np.concatenate([[start], cuts, [end]]))
            pieces += [np.arange(a, b) for a, b in zip(edges[:-1], edges[1:])]
        return np.concatenate([pieces[i] for i in rng.permutation(len(pieces))])

    def _places(self, rank: int) -> np.ndarray:
        """Places of the global order that `rank` owns: chunks of `window` places dealt out in turn."""
        places = np.arange(self.num_samples)
        return places[(places // self.window) % self.world_size == rank]

    def rank_positions(self, epoch: int) -> np.ndarray:
        """Places in the epoch's global order that this rank loads, in its own order."""
        if self.window > 1:
            mine = self._places(self.rank)
            return mine[np.arange(self.per_rank) % len(mine)]  # wraps around only when padding
        total = self.per_rank * self.world_size
        positions = np.arange(total) % self.num_samples  # wraps around only when padding
        return positions[self.rank :: self.world_size][: self.per_rank]

    def _epoch(self, epoch: int) -> tuple[np.ndarray, np.ndarray]:
        """(order, this rank's places) of an epoch, kept for the two latest epochs (a permutation of a large
        dataset costs milliseconds: once per epoch, not per batch)."""
        if epoch not in self._cache:
            if len(self._cache) >= 2:
                del self._cache[min(self._cache)]
            self._cache[epoch] = (self.order(epoch), self.rank_positions(epoch))
        return self._cache[epoch]

    def task(self, epoch: int, batch: int) -> BatchTask:
        """The `batch`-th batch of `epoch` for this rank."""
        if not 0 <= batch < self.batches_per_epoch:
            raise IndexError(f"batch {batch} outside [0, {self.batches_per_epoch})")
        order, mine = self._epoch(epoch)
        positions = mine[batch * self.batch_size : (batch + 1) * self.batch_size]
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
