from __future__ import annotations

import pytest
import torch
from vla_graph import RandomDraws, RandomSpec


def test_specs_are_validated_with_the_field_name() -> None:
    with pytest.raises(ValueError, match="RandomSpec.distribution='beta'"):
        RandomSpec(shape=(2,), distribution="beta")
    with pytest.raises(ValueError, match="RandomSpec.shape"):
        RandomSpec(shape=[2])  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="RandomSpec.std"):
        RandomSpec(shape=(2,), std=0.0)
    with pytest.raises(ValueError, match="RandomSpec.low"):
        RandomSpec(shape=(2,), distribution="uniform", low=1.0, high=1.0)
    with pytest.raises(ValueError, match="floating dtype"):
        RandomSpec(shape=(2,), dtype=torch.int64)


def test_draws_follow_the_generator_stream_in_spec_order() -> None:
    specs = {
        "t": RandomSpec(shape=(4,), distribution="uniform", low=0.0, high=0.5),
        "noise": RandomSpec(shape=(4, 3), mean=1.0, std=2.0, dtype=torch.float64),
    }
    first = RandomDraws(specs, generator=torch.Generator().manual_seed(5))
    a, b = first(), first()
    assert a["t"].shape == (4,) and a["noise"].dtype == torch.float64
    assert bool((a["t"] >= 0).all() and (a["t"] < 0.5).all())
    assert not torch.equal(a["noise"], b["noise"])  # the stream advances
    gen = torch.Generator().manual_seed(5)
    t = torch.empty(4).uniform_(0.0, 0.5, generator=gen)
    noise = torch.empty(4, 3, dtype=torch.float64).normal_(1.0, 2.0, generator=gen)
    assert torch.equal(a["t"], t) and torch.equal(a["noise"], noise)


def test_draws_check_their_arguments() -> None:
    with pytest.raises(ValueError, match="at least one spec"):
        RandomDraws({})
    with pytest.raises(TypeError, match="'t' is a dict"):
        RandomDraws({"t": {"shape": (2,)}})  # type: ignore[dict-item]
    with pytest.raises(ValueError, match="generator is on cpu but device is meta"):
        RandomDraws({"t": RandomSpec(shape=(2,))}, device="meta", generator=torch.Generator())
