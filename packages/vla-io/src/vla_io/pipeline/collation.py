"""Collation of sample dicts into batch dicts, for datasets that only offer `__getitem__`."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import torch

from .._errors import DatasetFormatError


def collate(samples: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """Stack tensors and arrays along a new batch axis; other values become lists."""
    if not samples:
        raise ValueError("cannot collate an empty list of samples")
    out: dict[str, Any] = {}
    for key in samples[0]:
        values = [s[key] for s in samples]
        first = values[0]
        if isinstance(first, torch.Tensor) or (isinstance(first, np.ndarray) and first.dtype != object):
            _same_shapes(key, values)
        if isinstance(first, torch.Tensor):
            out[key] = torch.stack(values)
        elif isinstance(first, np.ndarray) and first.dtype != object:
            out[key] = torch.from_numpy(np.stack(values))
        elif isinstance(first, (bool, int, float, np.number, np.bool_)):
            out[key] = torch.as_tensor(np.asarray(values))
        else:
            out[key] = list(values)
    return out


def _same_shapes(key: str, values: Sequence[Any]) -> None:
    """Samples that cannot be stacked fail as a sample error naming the key and the shapes (which
    `skip_bad_samples` can skip), not as torch's or numpy's stacking message."""
    shapes = [tuple(getattr(v, "shape", ())) for v in values]
    odd = [i for i, shape in enumerate(shapes) if shape != shapes[0]]
    if odd:
        raise DatasetFormatError(
            f"key {key!r}: sample {odd[0]} of the batch has shape {shapes[odd[0]]}, sample 0 has {shapes[0]}"
        )
