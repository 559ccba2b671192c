"""gr00t-model's attention (`_attention`): the SDPA reference's contract, the CPU dispatch, and the Triton
kernels under Triton's interpreter (on a CPU, in fp16: the interpreter has no bf16 arithmetic) against fp64."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch
import torch.nn.functional as F
from gr00t_model._attention import attention, sdpa_attention
from gr00t_model._language import _repeat_heads, causal_padding_mask

_INTERPRETED = r"""
import json, torch
from gr00t_model import _attention_op as op
from gr00t_model._attention import sdpa_attention
# (batch, heads, kv heads, queries, keys, head dim, key mask, causal): the one-program backward (queries fit
# one tile, no shared kv heads) and the two-kernel one; split head dims (48 = 32 + 16, 80 = 64 + 16) and whole
# ones; several key blocks; grouped queries; padding rows under the causal mask
cases = [(2, 2, 2, 51, 51, 48, False, False), (2, 2, 2, 51, 70, 48, True, False), (1, 4, 2, 40, 40, 32, True, True),
         (1, 2, 2, 70, 70, 80, False, False), (1, 2, 1, 130, 130, 128, True, True)]
gen = torch.Generator().manual_seed(0)
rows = []
for b, h, hk, lq, lk, d, masked, causal in cases:
    q, k, v = (torch.randn(b, n, l, d, generator=gen).half() for n, l in ((h, lq), (hk, lk), (hk, lk)))
    keys = torch.rand(b, lk, generator=gen) > 0.3 if masked else None
    if keys is not None:
        keys[:, 0] = True  # every row has a key to attend to
    grad = torch.randn(b, h, lq, d, generator=gen).half()
    def run(fn, dtype):
        leaves = [t.to(dtype).requires_grad_() for t in (q, k, v)]
        out = fn(*leaves)
        return [out, *torch.autograd.grad(out, leaves, grad.to(dtype))]
    def ours(q_, k_, v_):
        out, _ = op.flash_attention(q_.transpose(1, 2), k_.transpose(1, 2), v_.transpose(1, 2), keys, causal, d**-0.5)
        return out.transpose(1, 2)
    sdpa = lambda q_, k_, v_: sdpa_attention(q_, k_, v_, keys, causal, d**-0.5)
    exact, mine, theirs = run(sdpa, torch.float64), run(ours, torch.float16), run(sdpa, torch.float16)
    err = lambda got: [(g.double() - e).abs().max().item() for g, e in zip(got, exact)]
    rows.append({"case": [b, h, hk, lq, lk, d, masked, causal], "ours": err(mine), "sdpa": err(theirs),
                 "scale": [e.abs().max().item() for e in exact]})
print(json.dumps(rows))
"""


def test_triton_kernels_match_fp64_as_closely_as_sdpa_in_the_same_precision() -> None:
    """Under Triton's interpreter, forward and the three gradients of every case: the kernels round the
    probabilities and dS to fp16 before their products (as flash kernels do), SDPA's math path rounds its own
    intermediates to fp16, so both errors are a few fp16 ulps of the result; ours may not exceed twice SDPA's
    plus one ulp at the result's scale."""
    pytest.importorskip("triton")
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    done = subprocess.run([sys.executable, "-c", _INTERPRETED], env=env, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-3000:]
    for row in json.loads(done.stdout.strip().splitlines()[-1]):
        for name, ours, sdpa, scale in zip(("out", "dq", "dk", "dv"), row["ours"], row["sdpa"], row["scale"]):
            assert ours <= 2 * sdpa + scale * 2**-10, (row["case"], name, ours, sdpa)


def test_the_reference_is_the_language_models_mask_and_repeated_heads() -> None:
    """sdpa_attention's causal + key-mask contract is what Qwen3's layers build: causal_padding_mask (padding keys
    hidden, every query sees itself) over k and v repeated to the query heads. Bitwise: the same SDPA call."""
    gen = torch.Generator().manual_seed(1)
    q = torch.randn(2, 4, 9, 16, generator=gen)
    k, v = torch.randn(2, 2, 9, 16, generator=gen), torch.randn(2, 2, 9, 16, generator=gen)
    valid = torch.tensor([[True] * 9, [True] * 6 + [False] * 3])
    ours = sdpa_attention(q, k, v, valid, causal=True)
    theirs = F.scaled_dot_product_attention(
        q, _repeat_heads(k, 2), _repeat_heads(v, 2), attn_mask=causal_padding_mask(valid)
    )
    assert torch.equal(ours, theirs)
    keys = torch.tensor([[True] * 5 + [False] * 4, [False] * 2 + [True] * 7])
    masked = F.scaled_dot_product_attention(
        q, _repeat_heads(k, 2), _repeat_heads(v, 2), attn_mask=keys[:, None, None]
    )
    assert torch.equal(sdpa_attention(q, k, v, keys), masked)


def test_cpu_tensors_take_sdpa_even_when_triton_is_asked_for() -> None:
    gen = torch.Generator().manual_seed(2)
    q, k, v = (torch.randn(2, 3, 7, 48, generator=gen).bfloat16() for _ in range(3))
    keys = torch.tensor([[True] * 7, [True] * 4 + [False] * 3])
    assert torch.equal(attention(q, k, v, keys, triton=True), sdpa_attention(q, k, v, keys))


def test_a_dit_asking_for_the_kernels_loads_them_when_built(monkeypatch) -> None:
    """Compiled blocks then only read a module global: torch.compile traces no import or cached lookup."""
    pytest.importorskip("triton")
    from gr00t_model import GR00TConfig, _attention
    from gr00t_model._dit import AlternateVLDiT

    monkeypatch.setattr(_attention, "_OP", None)
    AlternateVLDiT(GR00TConfig.preset("tiny", triton_attention=False))
    assert _attention._OP is None
    AlternateVLDiT(GR00TConfig.preset("tiny", triton_attention=True))
    assert _attention._OP is not None and hasattr(_attention._OP, "flash_attention")


def test_head_dims_the_kernels_take() -> None:
    """Two column tiles must cover the head dim exactly (a partly masked tile is not used: see supported)."""
    pytest.importorskip("triton")
    from gr00t_model._attention_op import head_split, supported

    assert [head_split(d) for d in (48, 64, 72, 80, 128)] == [(32, 16), (64, 0), (64, 16), (64, 16), (128, 0)]
    take = [supported(torch.empty(1, 4, 2, d, dtype=torch.bfloat16), torch.empty(1, 2, 2, d, dtype=torch.bfloat16))
            for d in (48, 64, 72, 80, 128, 8)]  # fmt: skip
    assert take == [True, True, False, True, True, False]
    assert not supported(torch.empty(1, 4, 2, 64), torch.empty(1, 2, 2, 64))  # fp32
    assert not supported(
        torch.empty(1, 3, 2, 64, dtype=torch.half), torch.empty(1, 2, 2, 64, dtype=torch.half)
    )
