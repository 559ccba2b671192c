"""The sample order of a mixture of datasets: each place of an epoch picks a member by weight, then a sample
of that member uniformly.

The policy, per epoch of `epoch_samples` places (default: every member's samples once in total):
1. each place's member is drawn independently with probability `weights[m]` (so member m fills
   Binomial(epoch_samples, weights[m]) places);
2. member m's places take its samples in the order of a seeded permutation of the member, a fresh
   permutation each time the member runs out within the epoch: uniform within the member, and no sample
   of it repeats before every one of its samples was taken.
`weights="proportional"` sets weights[m] = size[m] / total size, which in expectation is a uniform
shuffle of all samples. Both draws are pure functions of (seed, epoch), so the order plugs into
`EpochSampler`'s dealing of places to ranks unchanged: batches, per-sample seeds, `start_epoch_at` and
`consumed` (a resume at another world size or batch size) work as for one dataset.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from .sampler import EpochSampler

_MIXTURE_STREAM = 0x313C7E  # keeps the mixture's draws apart from a plain shuffle's of the same seed


def mixture_weights(sizes: Sequence[int], weights: Sequence[float] | str | None) -> np.ndarray:
    """Normalized member weights: given ones (each > 0, any scale), or proportional to `sizes` for None or
    "proportional". ValueError naming the member for a bad weight or an empty member."""
    sizes = [int(s) for s in sizes]
    if not sizes:
        raise ValueError("a mixture needs at least one member")
    for i, size in enumerate(sizes):
        if size < 1:
            raise ValueError(f"mixture member {i} has no samples")
    if weights is None or (isinstance(weights, str) and weights == "proportional"):
        values = np.asarray(sizes, dtype=np.float64)
    elif isinstance(weights, str):
        raise ValueError(f"mixture weights must be numbers or 'proportional', got {weights!r}")
    else:
        values = np.asarray([float(w) for w in weights], dtype=np.float64)
        if len(values) != len(sizes):
            raise ValueError(f"{len(values)} mixture weights for {len(sizes)} members")
        for i, w in enumerate(values):
            if not np.isfinite(w) or w <= 0:
                raise ValueError(f"mixture member {i}: weight must be a finite number > 0, got {w}")
    return values / values.sum()


class MixtureSampler(EpochSampler):
    """`EpochSampler` over the concatenated index space of mixture members (member m's samples are
    `offsets[m] .. offsets[m] + sizes[m]`), with the epoch order of the module docstring.

    `shuffle=False` keeps the member draws (a mixture has no dataset order) but takes each member's samples
    in their own order. Sample windows are not supported (a window would span one member only)."""

    def __init__(
        self, sizes: Sequence[int], batch_size: int, *, weights: Sequence[float] | str | None = None,
        epoch_samples: int | None = None, seed: int = 0, rank: int = 0, world_size: int = 1,
        shuffle: bool = True, drop_last: bool = True,
    ) -> None:  # fmt: skip
        self.sizes = np.asarray([int(s) for s in sizes], dtype=np.int64)
        self.weights = mixture_weights(sizes, weights)
        self.offsets = np.concatenate([[0], np.cumsum(self.sizes)[:-1]]).astype(np.int64)
        total = int(self.sizes.sum()) if epoch_samples is None else int(epoch_samples)
        if total < 1:
            raise ValueError(f"epoch_samples must be >= 1, got {total}")
        super().__init__(
            total, batch_size, seed=seed, rank=rank, world_size=world_size, shuffle=shuffle,
            drop_last=drop_last,
        )  # fmt: skip

    def members(self, epoch: int) -> np.ndarray:
        """The member of each place of `epoch`'s global order (int64 [epoch_samples])."""
        rng = np.random.default_rng([self.seed & 0xFFFFFFFF, epoch, _MIXTURE_STREAM])
        return rng.choice(len(self.sizes), size=self.num_samples, p=self.weights).astype(np.int64)

    def order(self, epoch: int) -> np.ndarray:
        """The epoch's global order: indices into the concatenated members."""
        members = self.members(epoch)
        out = np.empty(self.num_samples, dtype=np.int64)
        for m, (size, offset) in enumerate(zip(self.sizes.tolist(), self.offsets.tolist())):
            places = np.flatnonzero(members == m)
            if not len(places):
                continue
            rounds = -(-len(places) // size)
            if self.shuffle:
                rng = np.random.default_rng([self.seed & 0xFFFFFFFF, epoch, _MIXTURE_STREAM, m + 1])
                local = np.concatenate([rng.permutation(size) for _ in range(rounds)])
            else:
                local = np.tile(np.arange(size), rounds)
            out[places] = offset + local[: len(places)]
        return out

    def describe(self) -> dict:
        """What a saved position must share with the sampler that resumes it (sizes and weights)."""
        return {"sizes": self.sizes.tolist(), "weights": [round(float(w), 12) for w in self.weights]}
