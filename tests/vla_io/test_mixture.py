"""MixtureDataset + MixtureSampler: member frequencies follow the weights, samples are uniform within a
member, parts are merged in request order through each member's transform, and a pipeline over a mixture
resumes exactly (also at another world size)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from vla_io import DatasetFormatError, MixtureDataset, MixtureMember, Pipeline
from vla_io.dataset import MIXTURE_KEY
from vla_io.pipeline import MixtureSampler


class Rows:
    """A plain dataset: sample i is (member id, i) plus a state vector of `dim` values."""

    def __init__(self, member: int, size: int, dim: int) -> None:
        self.member, self.size, self.dim = member, size, dim

    def __len__(self) -> int:
        return self.size

    def __getitem__(self, i: int) -> dict:
        return {
            "who": torch.tensor([self.member, i]),
            "state": torch.full((self.dim,), float(i)),
            "task": f"m{self.member}",
        }


def _pad_state(width: int):
    def transform(batch: dict) -> dict:
        state = batch["state"]
        return {**batch, "state": torch.nn.functional.pad(state, (0, width - state.shape[1]))}

    return transform


def _mixture(weights=(0.5, 0.2, 0.3), sizes=(30, 50, 70), dims=(3, 5, 4)) -> MixtureDataset:
    members = [
        MixtureMember(Rows(m, size, dim), weight=w, transform=_pad_state(max(dims)), name=f"d{m}")
        for m, (w, size, dim) in enumerate(zip(weights, sizes, dims))
    ]
    return MixtureDataset(members)


def test_member_frequencies_follow_the_weights():
    """Member m fills Binomial(N, w_m) places of an epoch: every count within 5 standard deviations of N w_m
    (seeded, so the check is deterministic; by chance a 5-sigma miss has probability below 1e-6)."""
    weights = np.array([0.5, 0.2, 0.3])
    sampler = MixtureSampler([30, 500, 70], 8, weights=[5, 2, 3], epoch_samples=20_000, seed=3)
    assert np.allclose(sampler.weights, weights)
    n = sampler.num_samples
    for epoch in range(3):
        counts = np.bincount(sampler.members(epoch), minlength=3)
        sigma = np.sqrt(n * weights * (1 - weights))
        assert np.all(np.abs(counts - n * weights) <= 5 * sigma), (epoch, counts)
        order = sampler.order(epoch)
        member = np.searchsorted(sampler.offsets, order, side="right") - 1
        assert np.array_equal(member, sampler.members(epoch))  # each place holds a sample of its member


def test_uniform_within_a_member_and_no_repeat_before_every_sample_was_taken():
    sampler = MixtureSampler([30, 500, 70], 8, weights=[5, 2, 3], epoch_samples=20_000, seed=3)
    order = sampler.order(0)
    small = order[order < 30]  # member 0: about 10,000 places over 30 samples
    counts = np.bincount(small, minlength=30)
    assert counts.max() - counts.min() <= 1  # whole permutations, then part of one
    assert len(set(small[:30].tolist())) == 30
    large = order[(order >= 30) & (order < 530)]  # member 1: about 4,000 places over 500 samples
    counts = np.bincount(large - 30, minlength=500)
    assert counts.max() - counts.min() <= 1
    assert not np.array_equal(order, sampler.order(1))
    again = MixtureSampler([30, 500, 70], 8, weights=[5, 2, 3], epoch_samples=20_000, seed=3)
    assert np.array_equal(order, again.order(0))


def test_proportional_weights_follow_the_sizes():
    sampler = MixtureSampler([10, 30, 60], 4, weights="proportional")
    assert np.allclose(sampler.weights, [0.1, 0.3, 0.6]) and sampler.num_samples == 100
    with pytest.raises(ValueError, match="member 1: weight must be"):
        MixtureSampler([10, 30], 4, weights=[1, 0])
    with pytest.raises(ValueError, match="2 mixture weights for 3 members"):
        MixtureSampler([10, 30, 5], 4, weights=[1, 2])


def test_batches_merge_each_members_transformed_part_in_request_order():
    mixture = _mixture()
    indices = np.array([31, 0, 149, 85, 2, 79])  # d1, d0, d2, d2, d0, d1
    batch = mixture.get_batch(indices)
    assert batch[MIXTURE_KEY].tolist() == [1, 0, 2, 2, 0, 1]
    expected = [(m, int(i - mixture.offsets[m])) for m, i in zip([1, 0, 2, 2, 0, 1], indices)]
    assert [tuple(w) for w in batch["who"].tolist()] == expected
    assert batch["state"].shape == (6, 5)  # each member padded to the widest by its transform
    assert batch["state"][0].tolist() == [1.0] * 5 and batch["state"][1].tolist() == [0.0] * 5
    assert batch["state"][2].tolist() == [69.0] * 4 + [0.0]
    assert batch["task"] == ["m1", "m0", "m2", "m2", "m0", "m1"]


def test_members_that_do_not_agree_are_errors_naming_the_key_and_members():
    members = [MixtureMember(Rows(0, 5, 3), name="small"), MixtureMember(Rows(1, 5, 4), name="large")]
    with pytest.raises(DatasetFormatError, match=r"key 'state': large gives .*\(4,\).* small .*\(3,\)"):
        MixtureDataset(members).get_batch([0, 6])
    with pytest.raises(ValueError, match="give every member a weight or none"):
        MixtureDataset([MixtureMember(Rows(0, 5, 3), weight=1.0), MixtureMember(Rows(1, 5, 3))])
    with pytest.raises(ValueError, match="mixture empty has no samples"):
        MixtureDataset([MixtureMember(Rows(0, 0, 3), name="empty")])


def _stream(pipe: Pipeline, batches: int) -> list[tuple]:
    out = []
    while len(out) < batches:
        for batch in pipe:
            out.append((batch["who"].tolist(), batch["sample_seed"].tolist(), batch["state"].tolist()))
            if len(out) == batches:
                break
    return out


@pytest.mark.parametrize("workers", [0, 2])
def test_pipeline_over_a_mixture_resumes_exactly(workers):
    """Batches after a resume from a mid-epoch state equal the uninterrupted run's, in worker processes
    (shared-memory arenas) as in the caller's thread; the epoch is 150 places, 18 batches of 8."""
    options = dict(seed=5, device="cpu", num_workers=workers, synchronous=workers == 0)
    with Pipeline(_mixture(), 8, **options) as pipe:
        whole = _stream(pipe, 30)  # crosses the epoch boundary
    with Pipeline(_mixture(), 8, **options) as pipe:
        first = _stream(pipe, 11)
        state = pipe.state_dict()
    with Pipeline(_mixture(), 8, **options) as pipe:
        pipe.load_state_dict(state)
        rest = _stream(pipe, 19)
    assert first + rest == whole
    members = {m for who, _, _ in whole for m, _ in who}
    assert members == {0, 1, 2}


def test_routing_by_affinity_keeps_the_batches():
    """Samples routed to workers by their member's key (affinity=True) arrive as whole, ordered batches."""
    mixture = _mixture()
    keys = mixture.affinity(np.arange(len(mixture)))
    assert len(np.unique(keys)) == len(mixture)  # Rows has no affinity: each sample its own key, per member
    options = dict(seed=2, device="cpu")
    with Pipeline(_mixture(), 8, synchronous=True, **options) as pipe:
        reference = _stream(pipe, 6)
    with Pipeline(_mixture(), 8, num_workers=2, affinity=True, **options) as pipe:
        assert _stream(pipe, 6) == reference


def test_a_mixture_resumed_at_another_world_size_continues_at_the_same_place():
    with Pipeline(_mixture(), 6, seed=1, device="cpu", synchronous=True, world_size=2, rank=0) as pipe:
        _stream(pipe, 4)
        state = pipe.state_dict()
    assert state["consumed"] == 4 * 6 * 2
    sampler = _mixture().epoch_sampler(4, seed=1)
    with Pipeline(_mixture(), 4, seed=1, device="cpu", synchronous=True) as pipe:
        pipe.load_state_dict(state)
        batch = next(iter(pipe))
    order = sampler.order(0)[48:52]  # the places both ranks had not taken yet
    member, local = _mixture().locate(order)
    assert [tuple(w) for w in batch["who"].tolist()] == list(zip(member.tolist(), local.tolist()))


def test_a_state_of_another_mixture_is_refused():
    with Pipeline(_mixture(), 8, seed=5, device="cpu", synchronous=True) as pipe:
        state = pipe.state_dict()
    other = Pipeline(_mixture(weights=(0.2, 0.5, 0.3)), 8, seed=5, device="cpu", synchronous=True)
    with other, pytest.raises(ValueError, match="Pipeline state has sampler="):
        other.load_state_dict(state)
    with pytest.raises(ValueError, match="sample_window > 1 is not supported by MixtureDataset"):
        Pipeline(_mixture(), 8, sample_window=2, device="cpu")
