"""gr00t-model's Triton attention on the GPU: the DiT's shapes and the general path against fp64, no worse than
SDPA's own kernels in bf16; compiled and CUDA-graphed calls equal to eager ones."""

from __future__ import annotations

import pytest
import torch
from gr00t_model._attention import attention, sdpa_attention

pytestmark = pytest.mark.gpu

if not torch.cuda.is_available():
    pytest.skip("needs CUDA", allow_module_level=True)
pytest.importorskip("triton")

# (batch, heads, kv heads, queries, keys, head dim, key mask, causal)
SHAPES = {
    "dit self": (16, 32, 32, 51, 51, 48, False, False),
    "dit cross": (16, 32, 32, 51, 204, 48, True, False),
    "two-kernel backward": (2, 8, 8, 130, 130, 80, True, False),
    "grouped causal": (4, 16, 8, 204, 204, 128, True, True),
}


def _inputs(b, h, hk, lq, lk, d, masked, seed=0):
    gen = torch.Generator(device="cuda").manual_seed(seed)
    q, k, v = (
        torch.randn(b, n, length, d, device="cuda", generator=gen).bfloat16()
        for n, length in ((h, lq), (hk, lk), (hk, lk))
    )
    keys = None
    if masked:
        keys = torch.rand(b, lk, device="cuda", generator=gen) > 0.25
        keys[:, 0] = True
    return q, k, v, keys, torch.randn(b, h, lq, d, device="cuda", generator=gen).bfloat16()


def _out_and_grads(fn, q, k, v, grad, dtype):
    leaves = [t.to(dtype).requires_grad_() for t in (q, k, v)]
    out = fn(*leaves)
    return [out, *torch.autograd.grad(out, leaves, grad.to(dtype))]


@pytest.mark.parametrize("name", list(SHAPES))
def test_forward_and_gradients_match_fp64_no_worse_than_sdpa(name: str) -> None:
    """Both round the probabilities (and ours dS) to bf16 before their products, so both errors are a few bf16
    ulps of the result: ours may not exceed twice SDPA's (cuDNN or memory-efficient, its own pick) plus one
    ulp at the result's scale."""
    b, h, hk, lq, lk, d, masked, causal = SHAPES[name]
    q, k, v, keys, grad = _inputs(b, h, hk, lq, lk, d, masked)

    def ours(*qkv):
        return attention(*qkv, key_mask=keys, causal=causal, triton=True)

    def sdpa(*qkv):
        return sdpa_attention(*qkv, keys, causal)

    exact = _out_and_grads(sdpa, q, k, v, grad, torch.float64)
    for what, got, theirs, ref in zip(
        ("out", "dq", "dk", "dv"),
        _out_and_grads(ours, q, k, v, grad, torch.bfloat16),
        _out_and_grads(sdpa, q, k, v, grad, torch.bfloat16),
        exact,
    ):
        err, sdpa_err = ((t.double() - ref).abs().max().item() for t in (got, theirs))
        assert err <= 2 * sdpa_err + ref.abs().max().item() * 2**-8, (name, what, err, sdpa_err)


def test_compiled_and_graphed_calls_equal_eager_bitwise() -> None:
    """The same kernels whatever the caller: torch.compile keeps the op's kernels (a triton_op) and a CUDA graph
    replays them. The kernels' arithmetic does not depend on the inputs' strides, so even where Inductor lays
    the inputs out differently the results are bitwise equal."""
    q, k, v, keys, grad = _inputs(*SHAPES["dit cross"][:7], seed=1)

    def step(q_, k_, v_):
        out = attention(q_ * 1.0, k_, v_, key_mask=keys, triton=True)
        return [out, *torch.autograd.grad(out, (q_, k_, v_), grad)]

    leaves = [t.clone().requires_grad_() for t in (q, k, v)]
    eager = step(*leaves)
    compiled = torch.compile(step, fullgraph=False)(*leaves)
    for a, c in zip(eager, compiled):
        assert torch.equal(a, c)
    static = [t.clone().requires_grad_() for t in (q, k, v)]
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        step(*static)  # warm up outside the graph (kernel compilation, autograd's buffers)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured = step(*static)
    graph.replay()
    torch.cuda.synchronize()
    for a, c in zip(eager, captured):
        assert torch.equal(a, c)
