"""Deterministic, resumable, distributed sample order: a pure function of (seed, epoch, rank).

Every epoch has one global order of places; rank r of W takes places r, r + W, r + 2W, ... (or whole
windows of places in turn), so after k batches of B on every rank the places [0, k*B*W) of the epoch are
consumed. That makes a position world-size independent: a run resumed at another world size or batch size
starts the epoch's rest at that place (`start_epoch_at`) and each of its ranks takes its share of the rest."""

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

    `start_epoch_at(epoch, place)` makes one epoch begin at a place of its global order (a resume at another
    world size or batch size): the places from there on are dealt out as above, and that epoch has
    `batches_in(epoch)` batches, fewer than `batches_per_epoch`.
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
        self._start: tuple[int, int] | None = None  # (epoch, first place) of an epoch resumed mid-way
        self.per_rank, self.batches_per_epoch = self._layout(0)
        if self.batches_per_epoch == 0:
            raise ValueError(
                f"no full batch: {num_samples} samples over {world_size} ranks at batch size {batch_size}"
            )

    def _layout(self, start: int) -> tuple[int, int]:
        """(places per rank, batches per rank) of an epoch whose places from `start` on are dealt out."""
        rest = self.num_samples - start
        if rest <= 0:
            return 0, 0
        counts = [len(self._places(r, start)) for r in range(self.world_size)] if self.window > 1 else None
        if self.drop_last:
            per_rank = min(counts) if counts else rest // self.world_size
            return per_rank, per_rank // self.batch_size
        per_rank = max(counts) if counts else -(-rest // self.world_size)
        return per_rank, -(-per_rank // self.batch_size)

    def start_epoch_at(self, epoch: int, place: int) -> None:
        """Let `epoch` begin at `place` of its global order (the places before were consumed by a run at
        another world size or batch size); later epochs start at 0. Only one epoch can start late."""
        if not 0 <= place <= self.num_samples:
            raise ValueError(f"place must be in [0, {self.num_samples}], got {place}")
        self._start = (epoch, place) if place else None
        self._cache.clear()

    def epoch_start(self, epoch: int) -> int:
        """The first place of `epoch`'s global order this sampler deals out (0 unless started late)."""
        return self._start[1] if self._start is not None and self._start[0] == epoch else 0

    def batches_in(self, epoch: int) -> int:
        """Batches of `epoch` on this rank: `batches_per_epoch`, or fewer for an epoch started late."""
        start = self.epoch_start(epoch)
        return self._layout(start)[1] if start else self.batches_per_epoch

    def consumed(self, epoch: int, batch: int) -> int:
        """Places of `epoch`'s global order taken by all ranks together before its batch `batch` (every
        rank is at the same batch). With windows, that is a prefix only when each rank took whole windows."""
        return min(self.num_samples, self.epoch_start(epoch) + batch * self.batch_size * self.world_size)

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

    def _places(self, rank: int, start: int = 0) -> np.ndarray:
        """Places of the global order from `start` on that `rank` owns: chunks of `window` places dealt out
        in turn."""
        places = np.arange(start, self.num_samples)
        return places[((places - start) // self.window) % self.world_size == rank]

    def rank_positions(self, epoch: int) -> np.ndarray:
        """Places in the epoch's global order that this rank loads, in its own order."""
        start = self.epoch_start(epoch)
        per_rank = self._layout(start)[0] if start else self.per_rank
        if self.window > 1:
            mine = self._places(self.rank, start)
            return mine[np.arange(per_rank) % len(mine)]  # wraps around only when padding
        total = per_rank * self.world_size
        positions = start + np.arange(total) % (self.num_samples - start)  # wraps only when padding
        return positions[self.rank :: self.world_size][:per_rank]

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
        if not 0 <= batch < self.batches_in(epoch):
            raise IndexError(f"batch {batch} of epoch {epoch} outside [0, {self.batches_in(epoch)})")
        order, mine = self._epoch(epoch)
        positions = mine[batch * self.batch_size : (batch + 1) * self.batch_size]
        key = (np.uint64(self.seed & 0xFFFFFFFF) << np.uint64(32)) ^ np.uint64(epoch)
        seeds = mix64(mix64(np.full(len(positions), key, dtype=np.uint64)) ^ positions.astype(np.uint64))
        return BatchTask(epoch, batch, order[positions], (seeds >> np.uint64(1)).astype(np.int64))

    def tasks(self, epoch: int, batch: int):
        """Every task from (epoch, batch) on, across epochs, forever."""
        while True:
            while batch < self.batches_in(epoch):
                yield self.task(epoch, batch)
                batch += 1
            epoch, batch = epoch + 1, 0
