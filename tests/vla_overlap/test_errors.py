"""Misuse gets a clear error naming what is wrong; unused parameters never hang."""

from __future__ import annotations

import pytest
import torch


@pytest.fixture(scope="module")
def misuse(pool) -> dict[str, str]:
    return pool.run("misuse_errors", 1)[0]


@pytest.mark.parametrize(
    ("case", "expected"),
    [
        (
            "backward_after_sync",
            "RuntimeError: gradient for 'head.bias' arrived after this step's gradient sync",
        ),
        ("second_gradient", "RuntimeError: a second gradient for 'embed."),
        ("frozen_in_optimizer", "ValueError: DistributedAdamW got no trainable parameter (frozen ones"),
        ("two_optimizers", "RuntimeError: a sharded optimizer is already attached"),
        ("add_param_group", "NotImplementedError: DistributedAdamW's parameter groups are fixed"),
        ("not_wrapped", "TypeError: DistributedAdamW needs an OverlapDataParallel model, got ToyNet"),
        ("foreign_state", "ValueError: not a DistributedAdamW state dict"),
        (
            "other_params",
            "ValueError: param_groups[0] differs from the saved one: saved-only ['head.weight']",
        ),
        ("nothing_trainable", "ValueError: the module has no trainable parameters"),
    ],
)
def test_misuse_is_reported_clearly(misuse: dict[str, str], case: str, expected: str) -> None:
    assert misuse[case].startswith(expected), misuse[case]


def test_a_parameter_without_gradient_is_named_on_every_rank(pool) -> None:
    results = pool.run("unused_params", 2, allow=False, skip_rank=99)  # unused everywhere
    for result in results:
        assert "received no gradient this step: 'unused.bias', 'unused.weight'" in result["error"]
        assert "allow_unused_params=True" in result["error"]


def test_parameters_unused_on_some_ranks_are_reduced_like_ddp_find_unused(pool) -> None:
    """Rank 1 skips a branch that rank 0 uses: no hang (buckets always launch in the same order) and the
    result equals torch DDP with find_unused_parameters=True, bitwise."""
    for result in pool.run("unused_params", 2, allow=True, skip_rank=1):
        assert "error" not in result, result.get("error")
        for name, expected in result["ddp"].items():
            assert torch.equal(result["ours"][name], expected), name


def test_wrapping_broadcasts_rank_zeros_parameters_and_buffers(pool) -> None:
    results = pool.run("broadcast_on_wrap", 3)
    assert not torch.equal(results[1]["before"]["head.weight"], results[0]["before"]["head.weight"])
    for result in results:
        for name, value in results[0]["before"].items():  # frozen parameters and buffers included
            assert torch.equal(result["after"][name], value), name
