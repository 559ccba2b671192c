"""Frozen linear layers prepared once (`_frozen_linear`): the padded MLP equals the plain one, FP8's scaling
semantics against a dequantized reference, the error a 3-bit mantissa allows, state-dict transparency and
refresh on load, and which layers the model changes."""

from __future__ import annotations

import pytest
import torch
from gr00t_model import GR00TN16, GR00TConfig, make_dummy_batch
from gr00t_model._frozen_linear import (
    FrozenLinear,
    MergedFrozenLinear,
    gelu_into_gemm,
    merge_qkv,
    pad_mlp,
    use_fp8,
)
from torch import nn


def _frozen_linear(k: int = 64, n: int = 48) -> nn.Linear:
    return nn.Linear(k, n).requires_grad_(False)


def _exactly_quantizable(rows: int, cols: int) -> torch.Tensor:
    """Rows of powers of two (and zeros) whose scaled values e4m3 holds exactly, each row's largest of
    another magnitude: only scales applied along the right axes reproduce the exact product."""
    signs = torch.randint(-1, 2, (rows, cols)).float()
    values = signs * 2.0 ** -torch.randint(0, 6, (rows, cols)).float()
    values[:, 0] = 1.0  # each row's largest magnitude is exactly 1 before its row factor
    return values * 2.0 ** torch.randint(-8, 8, (rows, 1)).float()


def test_exact_where_e4m3_holds_the_operands() -> None:
    linear = _frozen_linear()
    with torch.no_grad():
        linear.weight.copy_(_exactly_quantizable(48, 64))
    fp8 = FrozenLinear(linear, fp8=True)
    x = _exactly_quantizable(15, 64).reshape(3, 5, 64)
    torch.testing.assert_close(fp8(x), linear(x), rtol=1e-6, atol=1e-6)


def test_error_is_what_e4m3_allows() -> None:
    """e4m3 keeps 3 mantissa bits: each operand is off by at most 2^-4 relative, about 2^-4/sqrt(3) RMS when
    uniform, so the products by ~sqrt(2) of that and a K-term sum by the same ratio as its terms (random
    signs): about 5% RMS of the output. Not bf16's 0.3%; nonzero, or nothing was quantized."""
    linear = _frozen_linear(256, 128)
    x = torch.randn(64, 256)
    ref = linear(x)
    err = (FrozenLinear(linear, fp8=True)(x) - ref).square().mean().sqrt() / ref.square().mean().sqrt()
    assert 0.005 < err.item() < 0.08


def test_state_dict_is_unchanged_and_load_requantizes() -> None:
    model = nn.Sequential(_frozen_linear(), nn.GELU(), _frozen_linear(48, 32))
    keys = list(model.state_dict())
    assert use_fp8([model]) == 2
    assert list(model.state_dict()) == keys  # the quantized weights are not saved
    other = nn.Sequential(_frozen_linear(), nn.GELU(), _frozen_linear(48, 32))
    x = torch.randn(4, 64)
    before = model(x)
    model.load_state_dict(other.state_dict())
    after = model(x)
    assert not torch.equal(before, after)
    fresh = nn.Sequential(_frozen_linear(), nn.GELU(), _frozen_linear(48, 32))
    fresh.load_state_dict(other.state_dict())
    use_fp8([fresh])
    torch.testing.assert_close(after, fresh(x), rtol=0, atol=0)  # as if quantized from those weights


def test_fp8_takes_only_frozen_aligned_linears() -> None:
    model = nn.Sequential(
        _frozen_linear(), nn.Linear(48, 32), _frozen_linear(588, 48), _frozen_linear(48, 32)
    )
    assert (
        use_fp8([model]) == 2
    )  # not the trainable one (no backward), nor K = 588 (SigLIP2's patch embedding)
    assert [type(m).__name__ for m in model] == ["FrozenLinear", "Linear", "Linear", "FrozenLinear"]
    with pytest.raises(ValueError, match="divisible by 16"):
        FrozenLinear(_frozen_linear(20, 48), fp8=True)
    with pytest.raises(ValueError, match="frozen layers only"):
        FrozenLinear(nn.Linear(48, 32))


def test_padded_mlp_equals_the_plain_one() -> None:
    """Zero rows and columns add exact zeros (gelu(0) = 0); fp32 on CPU: equal to summation order."""
    mlp = nn.Module()
    mlp.fc1, mlp.act, mlp.fc2 = _frozen_linear(64, 200), nn.GELU(approximate="tanh"), _frozen_linear(200, 64)
    x = torch.randn(3, 7, 64)
    ref = mlp.fc2(mlp.act(mlp.fc1(x)))
    keys = list(mlp.state_dict())
    assert pad_mlp(mlp)
    assert mlp.fc1.prepared_weight.shape == (256, 64) and mlp.fc2.prepared_weight.shape == (64, 256)
    hidden = mlp.act(mlp.fc1(x))
    assert hidden.shape[-1] == 256 and not hidden[..., 200:].any()
    torch.testing.assert_close(mlp.fc2(hidden), ref, rtol=1e-6, atol=1e-6)
    assert list(mlp.state_dict()) == keys
    trainable = nn.Module()
    trainable.fc1, trainable.fc2 = nn.Linear(64, 200), _frozen_linear(200, 64)
    assert not pad_mlp(trainable)  # a trainable layer keeps its shape


def test_gelu_in_the_gemm_equals_the_separate_activation() -> None:
    """On a CPU the layer computes the same ops as before (the fused epilogue is CUDA's; the GPU test bounds
    its rounding). Padding is kept; exact GELU, other activations and trainable layers are left alone."""
    mlp = nn.Module()
    mlp.fc1, mlp.activation_fn = _frozen_linear(64, 200), nn.GELU(approximate="tanh")  # SigLIP2's
    mlp.fc2 = _frozen_linear(200, 64)
    x = torch.randn(3, 7, 64)
    ref = mlp.fc2(mlp.activation_fn(mlp.fc1(x)))
    keys = list(mlp.state_dict())
    assert pad_mlp(mlp) and gelu_into_gemm(mlp) and not gelu_into_gemm(mlp)
    assert isinstance(mlp.activation_fn, nn.Identity) and mlp.fc1.gelu and mlp.fc1.pad_out == 56
    torch.testing.assert_close(mlp.fc2(mlp.activation_fn(mlp.fc1(x))), ref, rtol=1e-6, atol=1e-6)
    assert list(mlp.state_dict()) == keys
    exact = nn.Module()
    exact.fc1, exact.activation_fn = _frozen_linear(64, 200), nn.GELU()
    trainable = nn.Module()
    trainable.fc1, trainable.activation_fn = nn.Linear(64, 200), nn.GELU(approximate="tanh")
    assert not gelu_into_gemm(exact) and not gelu_into_gemm(trainable)
    assert isinstance(exact.activation_fn, nn.GELU) and isinstance(trainable.fc1, nn.Linear)


def test_model_prepares_the_frozen_prefix_only() -> None:
    config = GR00TConfig.preset("tiny", frozen_dtype="float32", compute_dtype=None)
    model = GR00TN16(config).eval()
    batch = make_dummy_batch(config, 2, num_images=2)
    noise, t = torch.zeros(2, config.action_horizon, config.max_action_dim), torch.zeros(2)
    with torch.no_grad():
        ref = model(batch, noise=noise, t=t)["loss"]
        keys = list(model.state_dict())
        layers = config.vision_num_layers
        assert model.prepare_frozen_prefix() == {
            "padded_mlps": layers,
            "gelu_in_gemm": layers,
            "merged_qkv": layers,
            "fp8_linears": 0,
        }
        torch.testing.assert_close(model(batch, noise=noise, t=t)["loss"], ref, rtol=1e-6, atol=0)
        done = model.prepare_frozen_prefix(fp8=True)
        out = model(batch, noise=noise, t=t)["loss"]
    assert list(model.state_dict()) == keys
    assert not any(hasattr(layer.self_attn, "qkv") for layer in model.backbone.vision_model.encoder.layers)
    fp8 = {name for name, m in model.named_modules() if isinstance(m, FrozenLinear) and m.fp8}
    assert done["fp8_linears"] == len(fp8) > 0
    allowed = ("backbone.vision_model.encoder.", "backbone.mlp1.") + tuple(
        f"backbone.language_model.layers.{i}." for i in range(model.backbone.frozen_depth())
    )
    assert all(name.startswith(allowed) for name in fp8)
    assert any(name.startswith("backbone.language_model.layers.") for name in fp8)
    assert any(name.endswith("mlp.fc1") for name in fp8)  # a padded layer turned FP8 too
    assert all(m.gelu for name, m in model.named_modules() if name.endswith("mlp.fc1") and name in fp8)
    assert not any(name.startswith("backbone.vision_model") and name.endswith("mlp.fc2") for name in fp8)
    assert torch.isfinite(out) and out != ref and abs(out - ref) / ref < 0.1
    trainable = GR00TN16(GR00TConfig.preset("tiny", tune_visual=True))
    # nothing frozen to pad, and nothing runs before a trainable weight
    assert trainable.prepare_frozen_prefix(fp8=True) == {
        "padded_mlps": 0,
        "gelu_in_gemm": 0,
        "merged_qkv": 0,
        "fp8_linears": 0,
    }


def test_merged_q_k_v_compute_what_the_three_layers_compute() -> None:
    attn = nn.Module()
    attn.q_proj, attn.k_proj, attn.v_proj = (_frozen_linear(64, 48) for _ in range(3))
    x = torch.randn(3, 7, 64)
    ref = torch.cat([attn.q_proj(x), attn.k_proj(x), attn.v_proj(x)], dim=-1)
    keys = list(attn.state_dict())
    assert merge_qkv(attn) and not merge_qkv(attn)
    assert list(attn.state_dict()) == keys  # the stacked copy is no parameter or buffer
    # The same dot products over the same K, each in one output column: fp32 summation order at most.
    torch.testing.assert_close(attn.qkv(x), ref, rtol=0, atol=64 * 2**-23 * float(ref.abs().max()))
    # A load refreshes the stacked copy, and so does a dtype change.
    state = {k: v + 1 for k, v in attn.state_dict().items()}
    attn.load_state_dict(state)
    torch.testing.assert_close(attn.qkv(x)[..., 48:96], attn.k_proj(x), rtol=1e-6, atol=1e-5)
    attn.to(torch.float64)
    assert attn.qkv.prepared_weight.dtype == torch.float64
    trainable = nn.Module()
    trainable.q_proj, trainable.k_proj, trainable.v_proj = (
        _frozen_linear(),
        nn.Linear(64, 48),
        _frozen_linear(),
    )
    assert not merge_qkv(trainable) and not hasattr(trainable, "qkv")
    with pytest.raises(ValueError, match="frozen"):
        MergedFrozenLinear([nn.Linear(4, 4)])
