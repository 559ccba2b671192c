"""EpochSampler: the default is a uniform shuffle; sample windows keep runs of neighbouring frames."""

from __future__ import annotations

import numpy as np
import pytest
from vla_io import EpochSampler

# five episodes of uneven lengths
LENGTHS = [37, 50, 8, 61, 44]
ENDS = np.cumsum(LENGTHS)
BOUNDS = np.stack([ENDS - LENGTHS, ENDS], 1)
N = int(ENDS[-1])


def _runs(order: np.ndarray) -> list[np.ndarray]:
    """Split an order into maximal runs of consecutive indices within one episode."""
    episode = np.searchsorted(ENDS, order, side="right")
    breaks = np.flatnonzero((np.diff(order) != 1) | (np.diff(episode) != 0)) + 1
    return np.split(order, breaks)


def test_default_order_is_a_uniform_permutation():
    sampler = EpochSampler(N, 4, seed=7)
    expected = np.random.default_rng([7, 3, 0xA11CE]).permutation(N)
    assert np.array_equal(sampler.order(3), expected)
    assert np.mean([len(r) for r in _runs(sampler.order(3))]) < 1.1  # no locality by accident


@pytest.mark.parametrize("window", [2, 4, 8])
def test_windows_are_runs_of_neighbouring_frames_covering_every_sample(window):
    sampler = EpochSampler(N, 4, seed=1, window=window, bounds=BOUNDS)
    first, second = sampler.order(0), sampler.order(1)
    for order in (first, second):
        assert sorted(order.tolist()) == list(range(N))
        runs = _runs(order)
        assert max(len(r) for r in runs) <= 2 * window  # two windows may meet by chance
        assert np.mean([len(r) for r in runs]) > 0.6 * window
    assert not np.array_equal(first, second)
    assert np.array_equal(first, EpochSampler(N, 4, seed=1, window=window, bounds=BOUNDS).order(0))


def test_windows_split_across_ranks_in_whole_chunks():
    ranks = [EpochSampler(N, 4, seed=2, rank=r, world_size=3, window=4, bounds=BOUNDS) for r in range(3)]
    seen = [np.concatenate([s.task(0, b).indices for b in range(s.batches_per_epoch)]) for s in ranks]
    assert len({len(x) for x in seen}) == 1 and len({s.batches_per_epoch for s in ranks}) == 1
    assert not set(seen[0].tolist()) & set(seen[1].tolist()) and not set(seen[1].tolist()) & set(
        seen[2].tolist()
    )
    assert np.mean([len(r) for r in _runs(seen[0])]) > 2  # each rank still reads runs


def test_window_needs_episode_bounds():
    with pytest.raises(ValueError, match="episode bounds"):
        EpochSampler(N, 4, window=4)
    with pytest.raises(ValueError, match="cover"):
        EpochSampler(N, 4, window=4, bounds=BOUNDS[:-1])
