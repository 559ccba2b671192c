from __future__ import annotations

import math

import pytest
import torch
from vla_graph import bucket_size, masked_mean, pad_batch, pad_dim, pad_sequences


def test_pad_dim_pads_the_end_and_marks_real_entries() -> None:
    x = torch.arange(6.0).reshape(2, 3)
    padded, mask = pad_dim(x, 5, dim=1, value=-1)
    assert padded.shape == (2, 5) and mask.shape == (2, 5) and mask.dtype == torch.bool
    assert torch.equal(padded[:, :3], x) and bool((padded[:, 3:] == -1).all())
    assert mask[:, :3].all() and not mask[:, 3:].any()


def test_pad_dim_leading_dim_and_negative_dim() -> None:
    x = torch.ones(3, 4, 2)
    padded, mask = pad_dim(x, 4, dim=0)
    assert padded.shape == (4, 4, 2) and mask.tolist() == [True, True, True, False]
    padded, mask = pad_dim(x, 6, dim=-2)
    assert padded.shape == (3, 6, 2) and mask.shape == (3, 6)


def test_pad_dim_errors_name_the_tensor() -> None:
    with pytest.raises(ValueError, match="tokens has length 7 along dim 0, more than the fixed size 5"):
        pad_dim(torch.zeros(7), 5, name="tokens")
    with pytest.raises(ValueError, match="scalar"):
        pad_dim(torch.tensor(1.0), 3)


def test_pad_sequences_stacks_variable_lengths() -> None:
    seqs = [torch.full((n, 2), float(n)) for n in (1, 3, 2)]
    stacked, mask = pad_sequences(seqs, 4)
    assert stacked.shape == (3, 4, 2)
    assert mask.sum(dim=1).tolist() == [1, 3, 2]
    assert torch.equal(stacked[1, :3], seqs[1]) and bool((stacked[1, 3] == 0).all())
    with pytest.raises(ValueError, match=r"chunks\[1\] has shape \(2, 3\)"):
        pad_sequences([torch.zeros(1, 2), torch.zeros(2, 3)], 4, name="chunks")


def test_pad_batch_pads_every_tensor_and_adds_a_mask() -> None:
    batch = {"x": torch.ones(3, 2), "y": torch.arange(3), "task": "pick"}
    out = pad_batch(batch, 5)
    assert out["x"].shape == (5, 2) and out["y"].tolist() == [0, 1, 2, 0, 0]
    assert out["valid"].tolist() == [True, True, True, False, False] and out["task"] == "pick"
    with pytest.raises(ValueError, match="disagree on their leading size"):
        pad_batch({"x": torch.ones(3), "y": torch.ones(2)}, 5)
    with pytest.raises(ValueError, match="already has a key 'valid'"):
        pad_batch({"x": torch.ones(3), "valid": torch.ones(3)}, 5)


def test_bucket_size_picks_the_smallest_fitting_bucket() -> None:
    assert bucket_size(17, [64, 16, 32]) == 32
    assert bucket_size(16, [64, 16, 32]) == 16
    with pytest.raises(ValueError, match="larger than every bucket"):
        bucket_size(65, [16, 64])


def test_masked_mean_ignores_padding_even_when_it_is_inf() -> None:
    values = torch.tensor([[1.0, 2.0, math.inf], [3.0, math.nan, 5.0]])
    mask = torch.tensor([[True, True, False], [True, False, True]])
    assert masked_mean(values, mask).item() == pytest.approx((1 + 2 + 3 + 5) / 4)


def test_masked_mean_broadcasts_over_trailing_dims_and_handles_empty_masks() -> None:
    values = torch.arange(12.0).reshape(2, 3, 2)
    mask = torch.tensor([[True, False, True], [False, False, False]])
    expected = values[0, [0, 2]].mean()
    assert torch.equal(masked_mean(values, mask), expected)
    assert masked_mean(values, torch.zeros(2, 3, dtype=torch.bool)).item() == 0.0
    with pytest.raises(ValueError, match="must match the leading dims"):
        masked_mean(values, torch.ones(3, dtype=torch.bool))
