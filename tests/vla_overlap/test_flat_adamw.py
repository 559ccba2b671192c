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
