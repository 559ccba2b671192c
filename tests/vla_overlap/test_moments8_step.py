"""DistributedAdamW(moments="int8"): the flat step with 8-bit moments (_moments8) against torch's AdamW, its Triton
kernel against its torch form (under Triton's interpreter), world size 2 against 1, and state dicts."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

SLACK = 2.0**-21  # fp32 rounding, in units of a block's largest magnitude (test_moments8_codec says why)


def _within_codec_bound(
    ours: torch.Tensor, exact: torch.Tensor, a: torch.Tensor, levels: int
) -> torch.Tensor:
    """|ours - exact| / bound per element, the bound (2 sqrt(a |y|) + a / (2L)) / (2L) from the block max a (for
    sqrt(v), L = 255, values below the first level a / L^2 are raised to it)."""
    a, y = a.double(), exact.double()
    bound = (2 * (a * y.abs()).sqrt() + a / (2 * levels)) / (2 * levels) + SLACK * a
    if levels == 255:
        bound = bound + (a / levels**2) * (y < a / levels**2)
    return (ours.double() - y).abs() / bound.clamp(min=1e-300)


@pytest.fixture(scope="module")
def shadow(pool):
    (result,) = pool.run("moments8_shadow", 1)
    return result


def test_each_step_is_torch_adamw_on_the_decoded_moments_and_stores_them_within_the_codec_bound(
    shadow,
) -> None:
    """50 steps of a small regression. At every step torch's AdamW, given the same masters, gradients and the
    decoded moments, computes the same masters to fp32 rounding (its lerp and CPU square root round a little
    differently), and the int8 run's new moments, decoded, lie within the codec's bound of torch's new ones
    (from the new block maxima: the codec tests derive it)."""
    worst = {"m": 0.0, "w": 0.0}
    for step, r in enumerate(shadow["records"]):
        torch.testing.assert_close(r["master"], r["shadow"], rtol=1e-5, atol=1e-7, msg=f"step {step}")
        for key, scale, levels in (("m", "am", 127), ("w", "aw", 255)):
            ratio = _within_codec_bound(r[key], r[f"{key}_ref"], r[scale], levels)
            assert bool((ratio <= 1).all()), (step, key, float(ratio.max()))
            worst[key] = max(worst[key], float(ratio.max()))
    assert min(worst.values()) > 0.5, worst  # the moments really are quantized


def test_fifty_int8_steps_stay_near_fp32_adamw(shadow) -> None:
    """The same 50 steps next to a plain torch AdamW run (fp32 moments). Each stored moment is off by at most
    1/127 (exp_avg) or 1/255 (sqrt(exp_avg_sq)) of relative resolution at its block's top, and an error in
    exp_avg lives on for about 1 / (1 - beta1) = 10 steps: the parameters' distance from the fp32 run stays
    below 10 / 127 (7.9 %) of the distance they travelled, and the losses agree within the same fraction."""
    result = shadow
    travelled = (result["fp32"] - result["start"]).norm()
    drift = float((result["int8"] - result["fp32"]).norm() / travelled)
    assert 0 < drift < 10 / 127, drift
    int8, fp32 = torch.tensor(result["losses"]["int8"]), torch.tensor(result["losses"]["fp32"])
    assert fp32[-10:].mean() < 0.85 * fp32[:5].mean()  # the problem is being learnt
    assert abs(float(int8[-10:].mean() / fp32[-10:].mean()) - 1) < 10 / 127


def test_two_ranks_on_the_same_data_equal_one_rank_bit_for_bit(pool) -> None:
    """Both ranks see the full batch, so the mean gradient is one rank's exactly (a sum of two halves); one
    bucket, so each quantization block holds the same elements at both world sizes; clipping inactive (its
    norm sums shards in another order). Then every bit agrees: parameters, and the decoded moments of the
    state dict."""
    (one,) = pool.run("moments8_same_data", 1)
    for two in pool.run("moments8_same_data", 2):
        for name, value in one["params"].items():
            assert torch.equal(two["params"][name], value), name
        for name, entry in one["state"]["state"].items():
            for key, value in entry.items():
                assert torch.equal(two["state"]["state"][name][key], value), (name, key)


def test_a_resumed_int8_run_is_the_continued_run_and_state_dicts_keep_the_fp32_format(pool) -> None:
    """At two ranks (bf16 parameters with an fp32 head, six buckets, masters as remainders, autocast, clipping):
    2 steps, a state dict, a fresh run that loads it and steps twice more equals 4 steps straight, bit for bit
    (norms, parameters, codes and scales). The state dict holds decoded fp32 moments on the host, in the format
    of fp32 runs: loading it and saving again gives it back bit for bit, in an int8 run and in an fp32-moment
    run; an fp32 run's state dict loads into an int8 run."""
    for result in pool.run("moments8_resume", 2):
        straight, resumed = result["straight"], result["resumed"]
        assert resumed["norms"] == straight["norms"][2:]
        for name, value in straight["params"].items():
            assert torch.equal(resumed["params"][name], value), name
        assert len(straight["buffers"]) >= 8
        assert all(torch.equal(a, b) for a, b in zip(resumed["buffers"], straight["buffers"]))
        saved = result["saved"]
        assert {key for _, key in saved} == {"master", "exp_avg", "exp_avg_sq", "step"}
        assert all(v.dtype == torch.float32 for (_, key), v in saved.items() if key != "step")
        assert result["on_host"] and result["inner_state_keys"] == ["step"]  # nothing else kept in fp32
        for other in ("saved_again", "into_fp32"):
            assert result[other].keys() == saved.keys()
            for entry, value in saved.items():
                assert torch.equal(result[other][entry], value), (other, entry)
        assert result["from_fp32_moved"]


def test_the_8bit_moments_need_the_flat_step_and_a_known_name(pool) -> None:
    (result,) = pool.run("moments8_refusals", 1)
    assert "moments must be 'fp32' or 'int8', got 'int4'" in result["int4"]
    assert "moments='int8') needs the flat step" in result["no_flat"]
    assert "moments='int8') needs the flat step" in result["fp64"]  # float64 masters: no flat step at all
    assert result["auto_kernel"] == "torch" and result["moments"] == "int8"


def test_the_kernel_gives_the_bits_of_the_torch_form() -> None:
    """Three steps of the Triton kernel under Triton's interpreter (a fresh process: the interpreter is chosen
    when kernels are defined) and of _moments8.torch_step8 from the same state: runs of two table rows,
    padding, clipping, idle blocks, masters as remainders or not. Both round every operation as IEEE fp32
    does, in the same order, without fused multiply-adds: the same bits."""
    pytest.importorskip("triton")
    script = Path(__file__).with_name("_moments8_kernel_check.py")
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    done = subprocess.run([sys.executable, str(script)], env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    found = json.loads(done.stdout.strip().splitlines()[-1])
    assert len(found) == 4
    for case, checks in found.items():
        assert checks.pop("moved") and checks.pop("nonzero_codes") > 1000, case
        assert all(checks.values()), (case, checks)


@pytest.mark.parametrize("world_size", [1, 2])
def test_moments_staged_as_stored_decode_later_to_the_state_dict_and_resume_exactly(pool, world_size) -> None:
    """`state_dict(on_device=True, encoded_moments=True)` hands each moment over as its codes and block scales
    (nothing decoded while a training loop would wait): at one rank views of the live buffers, at two the codes
    and scales of every rank's block-aligned shard, gathered as stored. Copied out (or taken through `keep`, as
    gr00t-train's staging does at more ranks), then decoded with `decode_moments` after the optimizer stepped
    on, they equal the decoded `state_dict()` of the save step bit for bit (the decode is one fp32 multiply per
    element from its code and its block's scale, the same on every device and at every world size), and a run
    resumed from them at the same world size continues as the uninterrupted run, bit for bit. At two ranks the
    moments' all-gathers receive 2.125 bytes per element (int8 codes, one fp32 scale per 64) where decoded ones
    receive 8. At two ranks some parameters are split between the ranks' shards."""
    results = pool.run("moments8_staged_resume", world_size)
    assert any(result["split"] for result in results) == (world_size > 1)
    for result in results:
        assert result["kinds"]["exp_avg"] == "dict" and result["kinds"]["exp_avg_sq"] == "dict"
        assert result["kinds"]["master"] == "Tensor" and result["formats"] == [result["encoded_format"]]
        decoded, reference = result["decoded"], result["reference"]
        assert decoded.keys() == reference.keys() == result["decoded_kept"].keys()
        assert {key for _, key in decoded} == {"master", "exp_avg", "exp_avg_sq", "step"}
        for entry, value in reference.items():
            assert decoded[entry].dtype == value.dtype and torch.equal(decoded[entry], value), entry
            assert torch.equal(result["decoded_kept"][entry], value), entry
        assert result["resumed_norms"] == result["norms"][2:]
        for name, value in result["params"].items():
            assert torch.equal(result["resumed_params"][name], value), name
        gathered = result["gathered"]
        if world_size == 1:
            assert gathered == {"encoded": 0, "decoded": 0, "masters": 0}  # views, nothing gathered
        else:
            elements = gathered["masters"] // 4  # both moments of every element of every rank's shards
            assert elements > 0
            assert gathered["encoded"] - gathered["masters"] == 2 * (elements + elements // 64 * 4)
            assert gathered["decoded"] - gathered["masters"] == 8 * elements
