"""Dropout keep-masks (`gr00t_model._keep_mask`): the Triton kernel run by Triton's interpreter on the CPU
(a fresh process, as the interpreter is chosen when kernels are defined), and torch's fallback."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys

import pytest
import torch
from gr00t_model._keep_mask import draw_keep_mask

_INTERPRETED = r"""
import json, torch
from gr00t_model._keep_mask_kernel import keep_mask
n, quarter = 10_007, 64  # 40 programs, the last one partly past the end
def draw(seed, p, fill):
    out = torch.full((n,), fill, dtype=torch.bool)
    keep_mask(out, torch.tensor([seed]), round(p * 2**32), quarter)
    return out
a, b = draw(7, 0.2, False), draw(7, 0.2, True)
print(json.dumps({
    "same_seed_same_mask": torch.equal(a, b),  # and every element written (the fills differ)
    "other_seed_differs": not torch.equal(a, draw(8, 0.2, False)),
    "kept_02": a.float().mean().item(),
    "kept_09": draw(7, 0.9, False).float().mean().item(),  # a threshold above 2^31
    "p1_keeps_none": not draw(7, 1.0, True).any().item(),  # threshold 2^32: nothing passes
    "p0_keeps_all": draw(7, 0.0, False).all().item(),
}))
"""


def _within(kept: float, p: float, n: int) -> bool:
    """The kept fraction of n Bernoulli(1 - p) draws within 6 standard deviations of 1 - p."""
    return abs(kept - (1 - p)) < 6 * math.sqrt(p * (1 - p) / n)


def test_the_kernel_keeps_one_minus_p_per_seed_and_writes_every_element() -> None:
    pytest.importorskip("triton")
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    done = subprocess.run([sys.executable, "-c", _INTERPRETED], env=env, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-3000:]
    found = json.loads(done.stdout.strip().splitlines()[-1])
    assert found["same_seed_same_mask"] and found["other_seed_differs"]
    assert found["p1_keeps_none"] and found["p0_keeps_all"]
    assert _within(found["kept_02"], 0.2, 10_007) and _within(found["kept_09"], 0.9, 10_007)


def test_the_cpu_fallback_follows_the_seed_and_keeps_one_minus_p() -> None:
    with torch.random.fork_rng():
        torch.manual_seed(3)
        a = draw_keep_mask((64, 1000), 0.3, "cpu")
        torch.manual_seed(3)
        b = draw_keep_mask((64, 1000), 0.3, "cpu")
    assert a.dtype == torch.bool and a.shape == (64, 1000) and torch.equal(a, b)
    assert _within(a.float().mean().item(), 0.3, a.numel())
    with pytest.raises(ValueError, match="dropout probability"):
        draw_keep_mask((4,), 1.5, "cpu")
