"""GPU only: frozen linears (`_frozen_linear`) on CUDA. FP8 compiled and captured in a CUDA graph agrees with its
eager run, and the eager run with the dequantized product (rowwise FP8 keeps the scales' meaning); the padded
SigLIP2 MLP, compiled and graphed, gives the plain prefix; GELU in the GEMM epilogue is tanh GELU, rounded no worse than in two passes."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
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
    """Prepared (padded, GELU in the GEMM epilogue), compiled and graphed, the prefix is no further from the
    fp32 result than the plain bf16 prefix is: padding adds exact zeros, and the epilogue rounds no worse
    than the two-pass activation, so only GEMM kernel choice and rounding order differ. FP8 vs bf16: what 3 mantissa bits over a few layers allow, compiled and graphed as much as eager.
    (Compiled and eager FP8 are not compared with each other directly: fused kernels round bf16 slightly
    differently, and each such difference moves some activations to the neighbouring fp8 value, 6% away;
    one layer with identical inputs is compared above.)"""
    config = GR00TConfig.preset("tiny", frozen_dtype="bfloat16", compute_dtype="bfloat16")
    torch.manual_seed(0)
    with torch.device("cuda"):
        model = GR00TN16(config).eval()
        fp32 = GR00TN16(GR00TConfig.preset("tiny", frozen_dtype="float32", compute_dtype=None)).eval()
    fp32.load_state_dict(model.state_dict())  # the same (bf16-valued) weights, computed in fp32
    batch = make_dummy_batch(config, 4, num_images=2, device="cuda")
    prefix = lambda: model.frozen_prefix(batch).hidden  # noqa: E731

    def graphed() -> torch.Tensor:
        model.compile_blocks()
        out = _graphed(prefix).clone()
        model.uncompile_blocks()
        return out

    with torch.no_grad():
        truth = fp32.frozen_prefix(batch).hidden
        plain_eager, plain_graphed = prefix().clone(), graphed()
        done = model.prepare_frozen_prefix()
        assert done["padded_mlps"] == done["gelu_in_gemm"] == done["merged_qkv"] == config.vision_num_layers
        prepared_graphed = graphed()
        assert model.prepare_frozen_prefix(fp8=True)["fp8_linears"] > 0
        fp8_eager, fp8_graphed = prefix().clone(), graphed()
    plain_error, prepared_error = _rel_rms(plain_graphed, truth), _rel_rms(prepared_graphed, truth)
    assert 0 < plain_error < 0.02, plain_error
    assert prepared_error <= 1.1 * plain_error + 1e-3, (prepared_error, plain_error)
    eager_error = _rel_rms(fp8_eager, plain_eager)
    assert 0 < eager_error < 0.2, eager_error
    graphed_error = _rel_rms(fp8_graphed, plain_graphed)
    assert graphed_error < 1.5 * eager_error + 0.01, (graphed_error, eager_error)


def _gemm_state() -> str:
    """What decides which cuBLASLt kernel a product gets, for a failure's message."""
    import os

    return (
        f"CUBLAS_WORKSPACE_CONFIG={os.environ.get('CUBLAS_WORKSPACE_CONFIG')!r}, "
        f"tf32={torch.backends.cuda.matmul.allow_tf32}, "
        f"bf16_reduced_reduction={torch.backends.cuda.matmul.allow_bf16_reduced_precision_reduction}, "
        f"autocast={torch.is_autocast_enabled('cuda')}, blas={torch.backends.cuda.preferred_blas_library()}"
    )


def test_gelu_in_the_gemm_epilogue() -> None:
    """cuBLASLt's GELU epilogue is the tanh approximation (fp32: far closer to it than to exact GELU, whose
    gap the test sees), and in bf16 its error from the fp64 result is at most that of the two-pass path (which
    rounds the pre-activation, then the activation), within about one bf16 rounding (2^-9 relative)."""
    torch.manual_seed(0)
    for dtype in (torch.float32, torch.bfloat16):
        linear = nn.Linear(1152, 4304, device="cuda", dtype=dtype).requires_grad_(False)
        fused = FrozenLinear(linear, pad_out=48, gelu=True)
        x = torch.randn(2, 300, 1152, device="cuda", dtype=dtype)
        pre = x.reshape(-1, 1152).double() @ linear.weight.double().t() + linear.bias.double()
        tanh_ref, exact_ref = F.gelu(pre, approximate="tanh"), F.gelu(pre)
        out = fused(x).reshape(-1, 4352)
        assert not out[:, 4304:].any()  # padding stays zero through gelu
        out = out[:, :4304].double()
        if dtype == torch.float32:  # TF32 (10 mantissa bits) would miss by far more than 5% of the gap
            gap = (tanh_ref - exact_ref).abs().max().item()
            error = (out - tanh_ref).abs().max().item()
            assert error < 0.05 * gap, (error, gap, _gemm_state())
        else:
            two_pass = F.gelu(linear(x), approximate="tanh").reshape(-1, 4304)
            fused_error, two_pass_error = _rel_rms(out, tanh_ref), _rel_rms(two_pass, tanh_ref)
            assert fused_error < 2e-3, (fused_error, _gemm_state())
            assert fused_error <= two_pass_error * 1.05, (fused_error, two_pass_error, _gemm_state())
