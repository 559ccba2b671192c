"""Clipping folded into the fused AdamW kernel (DistributedAdamW sets its grad_scale) equals clipping by
multiplying the gradients, up to the two AdamW implementations' arithmetic (the fused kernel divides by
1/coef where the other multiplies by coef, and orders its operations differently: ~1e-6 relative)."""

from __future__ import annotations

import torch


def test_fused_adamw_clips_through_grad_scale(pool) -> None:
    for rank_result in pool.run("fused_clip", 2):
        plain, fused = rank_result["fused=False"], rank_result["fused=True"]
        assert plain["norms"][0] > 0.05, "the clip threshold must actually clip"
        torch.testing.assert_close(
            torch.tensor(fused["norms"]), torch.tensor(plain["norms"]), rtol=1e-5, atol=0
        )
        for name, value in plain["params"].items():
            torch.testing.assert_close(fused["params"][name], value, rtol=1e-5, atol=1e-6, msg=name)
        assert fused["scale_left"] is None  # the scale applies to one step only
