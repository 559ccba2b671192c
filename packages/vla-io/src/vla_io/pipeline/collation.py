"""Collation of sample dicts into batch dicts, for datasets that only offer `__getitem__`."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import torch


def collate(samples: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """Stack tensors and arrays along a new batch axis; other values become lists."""
    if not samples:
        raise ValueError("cannot collate an empty list of samples")
    out: dict[str, Any] = {}
    for key in samples[0]:
        values = [s[key] for s in samples]
        first = values[0]
        if isinstance(first, torch.Tensor):
            out[key] = torch.stack(values)
        elif isinstance(first, np.ndarray) and first.dtype != object:
            out[key] = torch.from_numpy(np.stack(values))
        elif isinstance(first, (bool, int, float, np.number, np.bool_)):
            out[key] = torch.as_tensor(np.asarray(values))
        else:
            out[key] = list(values)
    return out
