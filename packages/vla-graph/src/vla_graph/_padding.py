"""Fixed shapes for graphs: pad variable-sized data to a fixed size and carry a mask of the valid part.

Normalise losses by a tensor computed from the mask (`masked_mean`), never by a Python count: a graph
freezes Python numbers at capture."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import torch


def pad_dim(
    tensor: torch.Tensor, size: int, *, dim: int = 0, value: float = 0, name: str = "tensor"
) -> tuple[torch.Tensor, torch.Tensor]:
    """Pad `tensor` along `dim` to `size` with `value`.

    Returns the padded tensor and a bool mask of shape `padded.shape[:dim + 1]` that is True where the
    index along `dim` holds real data."""
    if tensor.dim() == 0:
        raise ValueError(f"{name} is a scalar; there is no dimension to pad")
    dim = dim % tensor.dim()
    length = tensor.shape[dim]
    if length > size:
        raise ValueError(f"{name} has length {length} along dim {dim}, more than the fixed size {size}")
    shape = list(tensor.shape)
    shape[dim] = size
    padded = tensor.new_full(shape, value)
    padded.narrow(dim, 0, length).copy_(tensor)
    mask = torch.zeros(shape[: dim + 1], dtype=torch.bool, device=tensor.device)
    mask.narrow(dim, 0, length).fill_(True)
    return padded, mask


def pad_sequences(
    sequences: Sequence[torch.Tensor], length: int, *, value: float = 0, name: str = "sequences"
) -> tuple[torch.Tensor, torch.Tensor]:
    """Stack tensors of shape [L_i, ...] into [N, length, ...] padded with `value`, plus a [N, length] mask."""
    if not sequences:
        raise ValueError(f"{name} is empty; nothing to pad")
    tail = sequences[0].shape[1:]
    for index, seq in enumerate(sequences):
        if seq.dim() == 0 or seq.shape[1:] != tail:
            raise ValueError(
                f"{name}[{index}] has shape {tuple(seq.shape)}; every sequence needs shape [L, *{tuple(tail)}]"
            )
    padded = [
        pad_dim(seq, length, dim=0, value=value, name=f"{name}[{i}]") for i, seq in enumerate(sequences)
    ]
    return torch.stack([p for p, _ in padded]), torch.stack([m for _, m in padded])


def pad_batch(
    batch: Mapping[str, Any], batch_size: int, *, value: float = 0, mask_key: str = "valid"
) -> dict[str, Any]:
    """Pad every tensor in `batch` along dim 0 to `batch_size` (e.g. the last, short batch of an epoch).

    Adds `batch[mask_key]`, a bool tensor [batch_size] that is True for real samples. Non-tensor values
    pass through unchanged. Tensors must agree on their leading size."""
    if mask_key in batch:
        raise ValueError(f"batch already has a key {mask_key!r}; choose another mask_key")
    sizes = {key: v.shape[0] for key, v in batch.items() if isinstance(v, torch.Tensor) and v.dim() > 0}
    if not sizes:
        raise ValueError("batch has no tensor with a leading (batch) dimension to pad")
    if len(set(sizes.values())) > 1:
        raise ValueError(f"batch tensors disagree on their leading size: {sizes}")
    out: dict[str, Any] = {}
    mask = None
    for key, item in batch.items():
        if key in sizes:
            out[key], mask = pad_dim(item, batch_size, dim=0, value=value, name=f"batch[{key!r}]")
        else:
            out[key] = item
    out[mask_key] = mask
    return out


def bucket_size(length: int, buckets: Sequence[int]) -> int:
    """The smallest bucket >= `length`: pad to a few fixed sizes and keep one graph per size."""
    fitting = [b for b in buckets if b >= length]
    if not fitting:
        raise ValueError(
            f"length {length} is larger than every bucket {sorted(buckets)}; add a larger bucket"
        )
    return min(fitting)


def masked_mean(values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Mean of `values` where `mask` is true, as a tensor (graph-safe: no Python count).

    `mask` covers the leading dimensions of `values` and is broadcast over the rest; an all-false mask
    gives 0 instead of NaN."""
    if mask.dim() > values.dim() or tuple(values.shape[: mask.dim()]) != tuple(mask.shape):
        raise ValueError(
            f"mask of shape {tuple(mask.shape)} must match the leading dims of values {tuple(values.shape)}"
        )
    keep = mask.to(torch.bool).reshape(tuple(mask.shape) + (1,) * (values.dim() - mask.dim()))
    keep = keep.expand_as(values)
    # torch.where, not a multiply: padded positions may hold inf or NaN.
    total = torch.where(keep, values, values.new_zeros(())).sum()
    return total / keep.sum().clamp_min(1).to(total.dtype)
