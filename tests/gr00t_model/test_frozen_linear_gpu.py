"""GPU only: frozen linears (`_frozen_linear`) on CUDA. FP8 compiled and captured in a CUDA graph agrees with its
eager run, and the eager run with the dequantized product (rowwise FP8 keeps the scales' meaning); the padded
SigLIP2 MLP, compiled and graphed, gives the plain prefix."""

from __future__ import annotations

import pytest
import torch
from gr00t_model import GR00TN16, GR00TConfig, make_dummy_batch
from gr00t_model._frozen_linear import FP8, FP8_MAX, FrozenLinear
from torch import nn

pytestmark = pytest.mark.gpu


def _graphed(fn, *args):
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):
            fn(*args)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = fn(*args)
    graph.replay()
    torch.cuda.synchronize()
    return out


def _rel_rms(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a.float() - b.float()).square().mean().sqrt() / b.float().square().mean().sqrt()).item()


def test_fp8_linear_on_cuda_matches_the_dequantized_product() -> None:
    torch.manual_seed(0)
    linear = nn.Linear(1152, 4304, device="cuda", dtype=torch.bfloat16).requires_grad_(False)
    fp8 = FrozenLinear(linear, fp8=True)
    x = torch.randn(2, 300, 1152, device="cuda", dtype=torch.bfloat16)
    rows = x.reshape(-1, 1152).float()
    scale = rows.abs().amax(1, keepdim=True) / FP8_MAX
    expected = ((rows / scale).to(FP8).float() * scale) @ (
        fp8.fp8_weight.float() * fp8.fp8_scale.reshape(-1, 1)
    ).t() + linear.bias.float()
    # bf16 output: one rounding (2^-9 relative), plus fp32 summation order
    assert _rel_rms(fp8(x).reshape(-1, 4304), expected) < 2e-3


def test_compiled_and_graphed_fp8_linear_equals_eager() -> None:
    """Inductor fuses the activation's scale and cast; they compute the same fp32 values, so the quantized
    activation and the product match eager up to the rare fp8 rounding tie that a reordered division moves."""
    torch.manual_seed(0)
    fp8 = FrozenLinear(
        nn.Linear(1152, 1152, device="cuda", dtype=torch.bfloat16).requires_grad_(False), fp8=True
    )
    x = torch.randn(4, 256, 1152, device="cuda", dtype=torch.bfloat16)
    eager = fp8(x)
    graphed = _graphed(torch.compile(fp8, dynamic=False), x)
    assert _rel_rms(graphed, eager) < 1e-3


def test_prepared_prefix_compiled_and_graphed() -> None:
    """Padding: the compiled, graphed prefix equals the plain one's up to GEMM kernel choice. FP8 vs bf16: what
    3 mantissa bits over a few layers allow, compiled and graphed as much as eager. (Compiled and eager FP8 are
    not compared with each other directly: fused kernels round bf16 slightly differently, and each such
    difference moves some activations to the neighbouring fp8 value, 6% away; one layer with identical
    inputs is compared above.)"""
    config = GR00TConfig.preset("tiny", frozen_dtype="bfloat16", compute_dtype="bfloat16")
    torch.manual_seed(0)
    with torch.device("cuda"):
        model = GR00TN16(config).eval()
    batch = make_dummy_batch(config, 4, num_images=2, device="cuda")
    prefix = lambda: model.frozen_prefix(batch).hidden  # noqa: E731

    def graphed() -> torch.Tensor:
        model.compile_blocks()
        out = _graphed(prefix).clone()
        model.uncompile_blocks()
        return out

    with torch.no_grad():
        plain_eager, plain_graphed = prefix().clone(), graphed()
        model.prepare_frozen_prefix()
        padded_graphed = graphed()
        assert model.prepare_frozen_prefix(fp8=True)["fp8_linears"] > 0
        fp8_eager, fp8_graphed = prefix().clone(), graphed()
    assert _rel_rms(padded_graphed, plain_graphed) < 4e-3
    eager_error = _rel_rms(fp8_eager, plain_eager)
    assert 0 < eager_error < 0.2
    assert _rel_rms(fp8_graphed, plain_graphed) < 1.5 * eager_error + 0.01
