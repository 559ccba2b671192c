"""A position saved at one world size (or batch size) continues at another: the epoch's global order goes
on where the saved ranks together stopped, and the new ranks share the rest of it."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from vla_io import EpochSampler, Pipeline


class _Indices:
    """A dataset whose sample i is just i."""

    def __init__(self, n: int) -> None:
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> dict:
        return {"index": torch.tensor(i)}


def _take(pipes: list[Pipeline], batches: int | None = None) -> list[list[int]]:
    """Each pipeline's samples of `batches` batches (None: the rest of the current epoch), in order."""
    out = []
    for pipe in pipes:
        seen, it = [], iter(pipe)
        for _ in range(batches if batches is not None else pipe.sampler.batches_in(pipe.epoch) - pipe._batch):
            seen += next(it)["index"].tolist()
        out.append(seen)
    return out


def _pipes(n: int, batch: int, world: int, **options) -> list[Pipeline]:
    return [
        Pipeline(
            _Indices(n), batch, synchronous=True, device="cpu", seed=5, rank=r, world_size=world, **options
        )
        for r in range(world)
    ]


@pytest.mark.parametrize(
    ("before", "after"),
    [((2, 3), (1, 3)), ((1, 4), (2, 4)), ((2, 3), (3, 2)), ((3, 2), (2, 5)), ((2, 4), (1, 8))],
    ids=["2->1", "1->2", "2->3 other batch", "3->2 other batch", "2->1 same global batch"],
)
def test_the_epoch_continues_in_its_global_order_at_another_world_size(before, after) -> None:
    (world, batch), (new_world, new_batch) = before, after
    n = 101
    old = _pipes(n, batch, world)
    taken = _take(old, 4)
    state = old[0].state_dict()
    assert state["consumed"] == 4 * batch * world
    assert all(p.state_dict()["consumed"] == state["consumed"] for p in old)  # every rank agrees
    new = _pipes(n, new_batch, new_world)
    for pipe in new:
        pipe.load_state_dict(state)
    rest = _take(new)
    order = EpochSampler(n, 1, seed=5).order(0)
    before_set = [i for seen in taken for i in seen]
    after_set = [i for seen in rest for i in seen]
    assert sorted(before_set) == sorted(order[: state["consumed"]].tolist())  # a prefix of the order
    assert len(set(before_set + after_set)) == len(before_set) + len(after_set)  # nothing repeated
    expected = order[state["consumed"] :]
    kept = (len(expected) // (new_batch * new_world)) * new_batch * new_world  # drop_last's tail only
    assert sorted(after_set) == sorted(expected[:kept].tolist())
    # rank r of the new world takes places r, r + M, ... of the rest, as in any epoch
    assert rest[0][:new_batch] == expected[: new_batch * new_world : new_world].tolist()
    # the next epoch is the usual one of the new world size
    fresh = _pipes(n, new_batch, new_world)
    for pipe, fresh_pipe in zip(new, fresh):
        assert pipe.epoch == 1
        fresh_pipe.load_state_dict({**fresh_pipe.state_dict(), "epoch": 1})
        assert _take([pipe], 2) == _take([fresh_pipe], 2)


def test_without_drop_last_every_sample_of_the_epoch_is_seen() -> None:
    n = 50
    old = _pipes(n, 3, 2, drop_last=False)
    taken = _take(old, 2)
    new = _pipes(n, 4, 3, drop_last=False)
    for pipe in new:
        pipe.load_state_dict(old[1].state_dict())
    rest = _take(new)
    seen = {i for part in taken + rest for i in part}
    assert seen == set(range(n))  # the rest is padded by repeating its own start, never lost


def test_a_resumed_epoch_resumes_again_at_the_same_size_exactly() -> None:
    old = _pipes(60, 4, 2)
    _take(old, 3)
    new = _pipes(60, 3, 3)
    for pipe in new:
        pipe.load_state_dict(old[0].state_dict())
    _take(new, 2)
    states = [p.state_dict() for p in new]
    assert states[0]["epoch_start"] == 24 and states[0]["consumed"] == 24 + 2 * 3 * 3
    again = _pipes(60, 3, 3)
    for pipe, state in zip(again, states):
        pipe.load_state_dict(state)
    assert _take(again) == _take(new)


def test_an_old_state_without_consumed_converts_from_its_batch() -> None:
    old = _pipes(40, 2, 2)
    _take(old, 3)
    state = {k: v for k, v in old[0].state_dict().items() if k not in ("consumed", "epoch_start")}
    new = _pipes(40, 4, 1)
    new[0].load_state_dict(state)
    order = EpochSampler(40, 1, seed=5).order(0)
    assert _take(new, 1)[0] == order[12:16].tolist()


def test_a_rest_shorter_than_a_batch_per_rank_moves_to_the_next_epoch() -> None:
    old = _pipes(20, 3, 1)
    _take(old, 6)  # 18 of 20 taken
    new = _pipes(20, 2, 2)
    for pipe in new:
        pipe.load_state_dict(old[0].state_dict())
        assert pipe.epoch == 1 and pipe.state_dict()["consumed"] == 0


def test_windows_continue_only_after_whole_windows() -> None:
    bounds = np.array([[0, 30], [30, 64]])
    options = dict(sample_window=4)

    class Episodes(_Indices):
        def episode_bounds(self):
            return bounds

    def pipes(batch, world):
        return [
            Pipeline(Episodes(64), batch, synchronous=True, device="cpu", seed=1, rank=r, world_size=world,
                     **options)
            for r in range(world)
        ]  # fmt: skip

    old = pipes(4, 2)
    taken = _take(old, 2)
    new = pipes(2, 3)
    for pipe in new:
        pipe.load_state_dict(old[0].state_dict())
    rest = _take(new)
    seen = [i for part in taken + rest for i in part]
    assert len(seen) == len(set(seen))
    half = pipes(2, 2)
    _take(half, 1)
    with pytest.raises(ValueError, match="part of a 4-sample window"):
        pipes(2, 1)[0].load_state_dict(half[0].state_dict())
