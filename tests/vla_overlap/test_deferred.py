"""No buffer is read before its collective was waited on, nor written while in flight.

The deferred process group (see _overlap_deferred_pg.py) poisons every buffer a collective may write with NaN at
launch and writes the result only on wait(); results must be bitwise equal to those on plain gloo. Two
sabotaged builds (a missing gradient wait, a forward pre-hook that dispatches without waiting) prove the
check can fail. The model runs its blocks in reverse registration order, so parameter gathers are
requested out of order.
"""

from __future__ import annotations

import pytest
import torch


def has_nan(params: dict[str, torch.Tensor]) -> bool:
    return any(bool(torch.isnan(t).any()) for t in params.values())


@pytest.mark.parametrize("world_size", [2, 3])
def test_results_on_the_deferred_group_equal_plain_gloo(pool, world_size: int) -> None:
    result = pool.run("deferred_vs_gloo", world_size)[0]
    for mode in ("overlap", "zero1"):
        deferred, gloo = result[f"{mode}/deferred"], result[f"{mode}/gloo"]
        assert not isinstance(deferred, str), deferred
        assert not has_nan(deferred)
        for name in gloo:
            assert torch.equal(deferred[name], gloo[name]), name


def _broken(result: object) -> bool:
    return isinstance(result, str) or has_nan(result)


def test_a_missing_gradient_wait_is_caught(pool) -> None:
    result = pool.run("deferred_vs_gloo", 2, break_what="grad_wait")[0]
    assert _broken(result["overlap/deferred"]) and _broken(result["zero1/deferred"])


def test_a_forward_that_does_not_wait_for_its_gather_is_caught(pool) -> None:
    result = pool.run("deferred_vs_gloo", 2, break_what="gather_wait")[0]
    assert _broken(result["zero1/deferred"])
    assert not _broken(result["overlap/deferred"])  # no gathers there: the sabotage must not matter


def _split(events: list[tuple], micro: int) -> list[list[tuple]]:
    """Events of each step's last microbatch (from ('micro', micro-1) to its ('backward_done', ...))."""
    steps, current = [], None
    for event in events:
        if event == ("micro", micro - 1):
            current = []
        elif event == ("backward_done", micro - 1):
            steps.append(current)
            current = None
        elif current is not None:
            current.append(event)
    return steps


@pytest.mark.parametrize("overlap", [True, False])
def test_buckets_launch_in_order_once_per_step_on_the_last_microbatch_only(pool, overlap: bool) -> None:
    micro = 3
    log = pool.run("dispatch_log", 2, overlap=overlap, micro=micro)[0]
    events, bucket_slots = log["events"], log["bucket_slots"]
    n_buckets = len(bucket_slots)
    assert n_buckets >= 4
    collectives = [e for e in events if e[0] == "all_reduce"]
    assert len(collectives) == 2 * n_buckets  # two steps, once per bucket each
    last = _split(events, micro)
    assert len(last) == 2 and sum(len([e for e in s if e[0] == "all_reduce"]) for s in last) == len(
        collectives
    )
    for step in last:
        launches = [e[1] for e in step if e[0] == "all_reduce"]
        assert launches == list(range(n_buckets))
        grads = [i for i, e in enumerate(step) if e[0] == "grad"]
        if not overlap:
            assert all(i > grads[-1] for i, e in enumerate(step) if e[0] == "all_reduce")
            continue
        # The log is flushed by a second gradient hook that runs right after the wrapper's own: the
        # collectives launched by the hook of gradient X appear just before ('grad', X).
        arrived: set[int] = set()
        next_bucket, launched = 0, []
        for event in step:
            if event[0] == "all_reduce":
                launched.append(event[1])
                continue
            arrived.add(event[1])
            expected = next_bucket  # every complete bucket (all lower ones too) launches at once
            while expected < n_buckets and set(bucket_slots[expected]) <= arrived:
                expected += 1
            assert launched == list(range(next_bucket, expected)), (event, launched)
            next_bucket, launched = expected, []
        assert next_bucket == n_buckets and not launched
