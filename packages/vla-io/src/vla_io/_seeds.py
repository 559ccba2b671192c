"""Per-sample seeds: the batch key they travel under, and the hash that makes them (and other draws that
must not depend on batching, ranks or the backend).

`Pipeline` gives every sample an int64 seed under `SEED_KEY` (a function of the seed, the epoch and the
sample's place in the epoch's order); `ImageAugment` draws each sample's random parameters from it.
"""

from __future__ import annotations

import numpy as np

SEED_KEY = "sample_seed"
"""The batch key of the per-sample seeds (int64, one per sample)."""

_MASK = np.uint64(0xFFFFFFFFFFFFFFFF)


def mix64(x: np.ndarray) -> np.ndarray:
    """splitmix64 finalizer: well-spread 64-bit values from consecutive inputs."""
    x = x.astype(np.uint64)
    with np.errstate(over="ignore"):
        x = (x + np.uint64(0x9E3779B97F4A7C15)) & _MASK
        x = ((x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)) & _MASK
        x = ((x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)) & _MASK
        return x ^ (x >> np.uint64(31))
