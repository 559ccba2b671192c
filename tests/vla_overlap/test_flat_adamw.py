"""DistributedAdamW's flat step (one pass per bucket: clipping, AdamW, bf16 copy) against torch's AdamW, at
two ranks with bf16 parameters and fp32 masters. The flat arithmetic follows torch's AdamW operation by
operation but in per-element tensors, and its moment update is a lerp written out: results agree to fp32
rounding (1e-6 relative), not bitwise. Its state dict continues in a torch-stepped optimizer and back."""

from __future__ import annotations

import torch


def test_flat_step_matches_torch_adamw_and_state_dicts_cross_over(pool) -> None:
    for rank_result in pool.run("flat_adamw", 2):
        torch_run, flat_run = rank_result["flat=None"], rank_result["flat=torch"]
        assert torch_run["norms"][0] > 0.05, "the clip threshold must actually clip"
        torch.testing.assert_close(
            torch.tensor(flat_run["norms"]), torch.tensor(torch_run["norms"]), rtol=1e-5, atol=0
        )
        assert flat_run["steps"] == torch_run["steps"] == [3.0] * len(torch_run["steps"])
        for key in ("masters", "moments"):  # fp32: the update itself, to fp32 rounding
            for name, value in torch_run[key].items():
                torch.testing.assert_close(flat_run[key][name], value, rtol=1e-5, atol=1e-7, msg=name)
        for key in ("params", "resumed"):
            for name, value in torch_run[key].items():
                # bf16 parameters: one bf16 rounding step apart at most
                torch.testing.assert_close(
                    flat_run[key][name].float(), value.float(), rtol=8e-3, atol=1e-5, msg=name
                )
        assert rank_result["lazy_moments"] and rank_result["state_before_step"] == []
        assert rank_result["moments_after_fresh_load"] and not any(rank_result["moments_after_fresh_load"])


def test_blocks_widen_over_padding_only_when_the_layout_is_aligned() -> None:
    """The kernel's blocks: runs starting at multiples of ALIGN (as the layout places parameters) widen to the
    next multiple, never into the next run or past the shard; a run that starts off the alignment, or a shard
    of another length, keeps every block exact (alignment 1)."""
    from vla_overlap._flat_adamw import ALIGN, plan_blocks
    from vla_overlap._layout import PARAM_ALIGN

    assert PARAM_ALIGN % ALIGN == 0  # what the widening relies on
    runs = [(0, 1000, 0), (1024, 1100, 1), (1152, 3000, 0)]
    blocks, align = plan_blocks(runs, 3072, block=1024)
    assert align == ALIGN == 64
    assert blocks == [(0, 1024, 0), (1024, 128, 1), (1152, 1024, 0), (2176, 832, 0)]
    covered = [(start, start + length) for start, length, _ in blocks]
    assert all(end <= nxt for (_, end), (nxt, _) in zip(covered, covered[1:])) and covered[-1][1] <= 3072
    assert all(start % 64 == 0 and length % 64 == 0 for start, length, _ in blocks)
    for ragged_runs, length in ((runs, 3000), ([(0, 100, 0), (100, 300, 1)], 320)):
        blocks, align = plan_blocks(ragged_runs, length, block=1024)
        assert align == 1
        exact = [(at, min(1024, e - at), r) for s, e, r in ragged_runs for at in range(s, e, 1024)]
        assert blocks == exact


def test_flat_step_reads_bf16_gradient_buffers_in_place_with_the_same_result(pool) -> None:
    """bf16 gradient buffers (grad_reduce_dtype=None) at one rank and one microbatch: the flat step reads them
    where they are, no fp32 copy, and gives the fp32 buffers' result bit for bit. Every buffered value is
    autograd's bf16 gradient either way and widening is exact, so the norm, the clipping and the update see
    the same numbers."""
    (result,) = pool.run("narrow_grads", 1)
    wide, narrow = result["torch.float32"], result["None"]
    assert wide["norms"][0] > 0.05, "the clip threshold must actually clip"
    assert "torch.bfloat16" in narrow["grad_dtypes"] and narrow["in_place"]
    assert wide["grad_dtypes"] == ["torch.float32"]
    assert narrow["norms"] == wide["norms"]
    for a, b in zip(narrow["masters"], wide["masters"]):
        assert torch.equal(a, b)
    for name, value in wide["params"].items():
        assert torch.equal(narrow["params"][name], value), name


def test_untouched_rows_of_a_tracked_table_only_decay_with_the_stepped_result(pool) -> None:
    """track_rows: the blocks of rows that never had a gradient skip the gradient and moments (and do nothing
    when the decay factor rounds to 1). AdamW moves such a row by weight decay alone, and the skipped
    arithmetic would only have added zeros, so the result is bitwise that of stepping every row; a run resumed
    from a state dict counts rows with moments as touched."""
    (result,) = pool.run("idle_rows", 1)
    for decay in (0.1, 1e-9):
        stepped, tracked = result[decay]["stepped"], result[decay]["tracked"]
        assert tracked["tracked"] == [True, True]
        for key in ("masters", "moments"):
            assert all(torch.equal(a, b) for a, b in zip(stepped[key], tracked[key])), (decay, key)
        assert all(torch.equal(stepped["params"][n], tracked["params"][n]) for n in stepped["params"])
        # two tables of 8 rows of one block each: rows 2 and 5 touched from the start, row 7 from step 2
        assert tracked["idle"] == [12, 12, 10, 10]
    resumed, full = result["resumed"], result[0.1]["tracked"]
    assert resumed["idle"] == [10, 10]  # rows 2 and 5 hold moments: touched, though the new record is empty
    assert all(torch.equal(full["params"][n], resumed["params"][n]) for n in full["params"])
    assert result["ragged_tracked"] is False
    assert "touched must be a bool tensor of shape (3,)" in result["wrong_record"]


def test_the_update_in_stages_marks_each_stage_once_its_parameters_hold_the_step(pool) -> None:
    """stage_update: at each stage's mark, the parameters of that stage and the earlier ones already hold the
    step's final values (block 0's too, though the last stage lists them again) and every later stage still
    has old ones (so a layer waiting for its stage reads
    the new weights, and the stages really are ordered). The same blocks in one stage give the same result
    bit for bit (the same block windows and arithmetic, in another order); against the one-pass step, whose
    windows are whole runs, within fp32 rounding (vectorized and tail loops of a CPU kernel may round alike or
    not), in bf16 parameters one rounding step at most."""
    (result,) = pool.run("staged_update", 1)
    plain, one, staged = result["plain"], result["one stage"], result["staged"]
    assert staged["count"] == 4 and one["count"] == 1 and plain["marks"] == []
    assert plain["norms"][0] > 0.05  # the threshold clips
    assert staged["norms"] == one["norms"]
    assert all(torch.equal(a, b) for a, b in zip(staged["masters"], one["masters"]))
    assert all(torch.equal(staged["params"][n], v) for n, v in one["params"].items())
    for a, b in zip(staged["masters"], plain["masters"]):
        torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-7)

    def stage_of(name: str) -> int:
        return int(name.split(".")[1]) + 1 if name.startswith("blocks.") else 0

    final = staged["params"]
    last_step = staged["marks"][-4:]
    assert [k for k, _ in staged["marks"]] == [0, 1, 2, 3] * 3
    for k, snapshot in last_step:
        for stage in range(4):
            names = [n for n in final if stage_of(n) == stage and not n.startswith("frozen")]
            same = [torch.equal(snapshot[n], final[n]) for n in names]
            assert all(same) if stage <= k else not all(same), (k, stage, same)
