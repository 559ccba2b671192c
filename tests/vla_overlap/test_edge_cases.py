"""Edge cases an independent check found at world sizes 2-4 (issue 14, item 8): parameters no rank used,
frozen parameters in the optimizer's groups, torch's clip_grad_norm_ under ZeRO-1, parameters read right
after step(), float64 parameters. Same tolerances as test_equivalence.py: bitwise at world size 2, 1e-6 at
3 and 4 (gloo's summation order depends on the bucket layout), fp32 rounding for the flat AdamW step."""

from __future__ import annotations

import pytest
import torch

WORLD_SIZES = (2, 3, 4)


def assert_params(actual: dict, expected: dict, bitwise: bool) -> None:
    assert actual.keys() == expected.keys()
    for name, value in expected.items():
        if bitwise:
            assert torch.equal(actual[name], value), f"{name}: max diff {(actual[name] - value).abs().max()}"
        else:
            torch.testing.assert_close(actual[name], value, atol=1e-6, rtol=1e-5, msg=name)


@pytest.fixture(scope="module")
def unused_runs(pool) -> dict[int, list[dict]]:
    return {ws: pool.run("unused_everywhere", ws) for ws in WORLD_SIZES}


@pytest.mark.parametrize("world_size", WORLD_SIZES)
@pytest.mark.parametrize(
    "mode", ["overlap", "allreduce_after_backward", "zero1", "zero1_sync_gather", "zero1_flat"]
)
def test_parameters_no_rank_used_are_not_stepped_like_ddp(unused_runs, world_size: int, mode: str) -> None:
    """A branch used by one rank, then by none, then by all; a layer never used: torch DDP leaves .grad None
    where no rank used a parameter, and AdamW skips it (no weight decay, no momentum)."""
    for rank_result in unused_runs[world_size]:
        reference = rank_result["ddp"]
        assert reference["grads_none"] == [
            [False, True],
            [False, True],
            [True, True],
            [False, True],
            [True, True],
        ]
        if mode == "zero1_flat":  # the flat step agrees with torch's AdamW to fp32 rounding
            for name, value in reference["params"].items():
                torch.testing.assert_close(rank_result[mode]["params"][name], value, rtol=1e-5, atol=1e-7)
        else:
            assert_params(rank_result[mode]["params"], reference["params"], bitwise=world_size == 2)
        if not mode.startswith("zero1"):  # without a sharded optimizer, .grad is exposed as DDP does
            assert rank_result[mode]["grads_none"] == reference["grads_none"]
        # AdamW's step count per parameter: 3 for the branch, none for the dead layer, 5 for the rest
        assert rank_result[mode]["steps"] == reference["steps"]
        assert reference["steps"]["unused.weight"] == 3.0 and "dead.weight" not in reference["steps"]


@pytest.mark.parametrize("world_size", [2, 3])
def test_a_branch_some_ranks_skip_keeps_the_lazy_gathers_in_step(pool, world_size: int) -> None:
    """One forward per step, a bucket per parameter: the ranks that run the branch dispatch the gathers of
    the buckets after it in their forward, the others do not. Every rank must still issue the same
    collectives in the same order (before: a hang, gloo timing out)."""
    for rank_result in pool.run("unused_everywhere", world_size, bucket_elements=1, micro=1):
        reference = rank_result["ddp"]["params"]
        for mode in ("overlap", "zero1", "zero1_sync_gather"):
            assert_params(rank_result[mode]["params"], reference, bitwise=world_size == 2)


def test_without_gradients_through_python_every_parameter_counts_as_used(pool) -> None:
    """A replayed CUDA graph runs no hook: nothing was seen, so nothing is skipped (and no rank hangs)."""
    for result in pool.run("unused_flags_without_python_gradients", 2):
        assert result["main_grad"] == result["mark_grads_synced"] == []
        assert result["eager"] == ["dead.bias", "dead.weight", "unused.bias", "unused.weight"]


def test_frozen_parameters_in_the_groups_are_skipped(pool) -> None:
    for rank_result in pool.run("frozen_in_optimizer_params", 2):
        assert_params(rank_result["zero1"]["params"], rank_result["ddp"]["params"], bitwise=True)
        for name, value in rank_result["ddp"]["params"].items():
            torch.testing.assert_close(rank_result["zero1_flat"]["params"][name], value, rtol=1e-5, atol=1e-7)
        assert not any(n.startswith("frozen.") for n in rank_result["zero1"]["saved"])
        assert rank_result["zero1"]["saved"] == rank_result["zero1_flat"]["saved"]


def test_torch_clip_grad_norm_under_zero1_raises_and_points_to_ours(pool) -> None:
    for result in pool.run("torch_clip_under_zero1", 2):
        for step in range(2):
            message = result[f"torch_clip_{step}"]
            assert "optimizer.clip_grad_norm_" in message and "model.clip_grad_norm_" in message, message
            assert result[f"ours_{step}"] > 0
            assert result[f"none_after_zero_grad_{step}"]
        assert "zero_grad()" in result["late_backward"], result["late_backward"]


@pytest.mark.parametrize(
    "how", ["eval", "wrapper_state_dict", "module_state_dict", "optimizer_state_dict", "finish_param_sync"]
)
def test_parameters_read_after_step_are_current(pool, how: str) -> None:
    """With lazy gathers (overlap_param_gather) parameters are gathered by the next forward; reading them
    before that through these calls must still see the updated values."""
    for world_size in (2, 3):
        for result in pool.run("reads_after_step", world_size, how=how):
            assert result["stale"] == [], f"world size {world_size}: {result['stale']}"


@pytest.mark.parametrize("world_size", [2, 3])
def test_float64_parameters_keep_float64_master_weights_and_moments(pool, world_size: int) -> None:
    for result in pool.run("float64_params", world_size):
        reference = result["ddp"]
        assert result["zero1"]["dtypes"] == result["zero1_fp32_grads"]["dtypes"] == ["torch.float64"]
        if world_size == 2:
            assert_params(result["zero1"]["params"], reference["params"], bitwise=True)
        for name, value in reference["params"].items():
            torch.testing.assert_close(result["zero1"]["params"][name], value, rtol=1e-12, atol=1e-14)
            # fp32 gradient buffers round the gradients, not the weights: fp32-level agreement, fp64 weights
            torch.testing.assert_close(
                result["zero1_fp32_grads"]["params"][name], value, rtol=1e-5, atol=1e-6
            )
        torch.testing.assert_close(
            torch.tensor(result["zero1"]["norms"]), torch.tensor(reference["norms"]), rtol=1e-12, atol=0
        )
        assert "float64" in result["flat"], result["flat"]
