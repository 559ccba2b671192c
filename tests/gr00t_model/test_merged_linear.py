"""The DiT's merged linears (GR00TConfig.merged_dit_linears) against the release's one-GEMM-per-Linear form."""

from __future__ import annotations

import pytest
import torch
from gr00t_model import GR00TN16, GR00TConfig, make_dummy_batch
from gr00t_model._merged_linear import MergedLinear


def _pair(**overrides) -> tuple[GR00TN16, GR00TN16]:
    """Both forms built from one seed: the merged Linears take their parts' initial values."""
    models = []
    for merged in (False, True):
        torch.manual_seed(0)
        models.append(GR00TN16(GR00TConfig.preset("tiny", merged_dit_linears=merged, **overrides)).train())
    return models[0], models[1]


def _release_named_grads(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """Gradients by state-dict (release) name: a merged Linear's split into its parts'."""
    grads = {n: p.grad for n, p in model.named_parameters() if p.grad is not None}
    for name, module in model.named_modules():
        if isinstance(module, MergedLinear):
            owner = name.rpartition(".")[0]
            at = f"{owner}." if owner else ""
            for kind in ("weight", "bias"):
                pieces = grads.pop(f"{name}.{kind}").split([rows for _, rows in module.parts])
                grads |= {f"{at}{part}.{kind}": g for (part, _), g in zip(module.parts, pieces)}
    return grads


def _loss_and_grads(model: GR00TN16, batch: dict) -> tuple[torch.Tensor, dict]:
    model.zero_grad(set_to_none=True)
    gen = torch.Generator().manual_seed(3)
    noise = torch.randn(2, model.config.action_horizon, model.config.max_action_dim, generator=gen)
    t = torch.rand(2, generator=gen) * 0.999
    with torch.random.fork_rng():  # the same dropout draws in both models, the global stream untouched
        torch.manual_seed(5)
        loss = model(batch, noise=noise, t=t)["loss"]
        loss.backward()
    return loss.detach(), _release_named_grads(model)


def test_state_dicts_keep_the_release_names_and_load_either_way() -> None:
    plain, merged = _pair()
    dit = merged.action_head.model
    assert hasattr(dit, "modulations") and not hasattr(dit, "proj_out_1")
    assert hasattr(dit.transformer_blocks[1].attn1, "to_qkv")  # self-attention merged
    assert hasattr(dit.transformer_blocks[0].attn1, "to_k")  # cross-attention keeps its own (another input)
    want, got = plain.state_dict(), merged.state_dict()
    assert set(got) == set(want)
    assert all(torch.equal(got[k], want[k]) for k in want)  # one seed, the same model
    assert not any(n.endswith(".norm1.linear.weight") for n, _ in merged.named_parameters())
    with torch.no_grad():  # the parts are views: writing one writes the merged weight
        got["action_head.model.transformer_blocks.3.norm1.linear.weight"].fill_(2.0)
        got["action_head.model.transformer_blocks.3.attn1.to_v.bias"].fill_(3.0)
    rows = merged.config.input_embedding_dim * 2
    assert bool((dit.modulations.weight[3 * rows : 4 * rows] == 2.0).all())
    inner = merged.config.dit_num_heads * merged.config.dit_head_dim
    assert bool((dit.transformer_blocks[3].attn1.to_qkv.bias[2 * inner :] == 3.0).all())
    plain.load_state_dict(merged.state_dict(), strict=True)  # and back into the release layout
    assert torch.equal(
        plain.state_dict()["action_head.model.transformer_blocks.3.attn1.to_v.bias"],
        got["action_head.model.transformer_blocks.3.attn1.to_v.bias"],
    )


def test_checkpoints_round_trip_between_the_forms(tmp_path) -> None:
    """save_pretrained of the merged form (the release's names), loaded in either form (built on the meta
    device, then copied into through the state dict's views)."""
    from gr00t_model import from_pretrained, save_pretrained

    _, merged = _pair()
    with torch.no_grad():
        merged.action_head.model.modulations.weight.add_(1.0)  # values the seed did not give
    save_pretrained(merged, tmp_path)
    want = merged.state_dict()
    for flag in (True, False):
        model, report = from_pretrained(tmp_path, merged_dit_linears=flag, return_report=True)
        assert not report.missing and not report.unexpected
        assert hasattr(model.action_head.model, "modulations") == flag
        got = model.state_dict()
        assert set(got) == set(want) and all(torch.equal(got[k], want[k]) for k in want), flag


def test_a_checkpoint_missing_a_part_reports_the_merged_key() -> None:
    plain, merged = _pair()
    state = plain.state_dict()
    del state["action_head.model.proj_out_1.bias"]
    result = merged.load_state_dict(state, strict=False)
    assert "action_head.model.modulations.bias" in result.missing_keys
    assert "action_head.model.transformer_blocks.0.norm1.linear.bias" in result.unexpected_keys


@pytest.mark.parametrize("compute_dtype", [None, "bfloat16"], ids=["fp32", "bf16-autocast"])
def test_the_merged_dit_computes_the_release_loss_and_gradients(compute_dtype) -> None:
    plain, merged = _pair(compute_dtype=compute_dtype)
    batch = make_dummy_batch(plain.config, 2, num_images=1)
    loss_a, grads_a = _loss_and_grads(plain, batch)
    loss_b, grads_b = _loss_and_grads(merged, batch)
    assert set(grads_a) == set(grads_b)
    # Each output element is the same dot product either way; only the input gradient of a merged Linear sums
    # its parts inside one GEMM instead of after it, a reassociation: fp32 rounding differences, which bf16
    # rounding of the activations can turn into one bf16 ulp (2^-8) in places.
    tol = {"rtol": 1e-5, "atol": 1e-6} if compute_dtype is None else {"rtol": 2e-2, "atol": 1e-4}
    torch.testing.assert_close(loss_b, loss_a, **tol)
    for name in grads_a:
        torch.testing.assert_close(grads_b[name], grads_a[name], **tol, msg=name)
    assert any(g.abs().sum() > 0 for n, g in grads_b.items() if ".norm1.linear." in n)


def test_inference_with_the_cached_cross_attention_keys_matches_the_release_form() -> None:
    plain, merged = (model.eval() for model in _pair())
    batch = make_dummy_batch(plain.config, 2, num_images=1)
    noise = torch.randn(2, plain.config.action_horizon, plain.config.max_action_dim)
    with torch.no_grad():
        want, got = plain.get_action(batch, noise=noise), merged.get_action(batch, noise=noise)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)  # fp32: the same products, as in training


@pytest.mark.gpu
def test_on_cuda_the_merged_dit_is_as_close_to_fp64_as_the_release_form() -> None:
    """n1.6-3b's DiT shapes (4 of its 32 blocks) under bf16 autocast on our attention kernels: the merged GEMMs'
    output and gradients against an fp64 run of the release form are as close as the release form's own."""
    from gr00t_model._dit import AlternateVLDiT

    config = GR00TConfig.preset("n1.6-3b", dit_num_layers=4, triton_attention=True)
    torch.manual_seed(0)
    reference = AlternateVLDiT(config).cuda().eval()
    gen = torch.Generator(device="cuda").manual_seed(1)
    tokens = torch.randn(16, 51, config.input_embedding_dim, device="cuda", generator=gen)
    context = torch.randn(16, 204, config.llm_hidden_size, device="cuda", generator=gen)
    buckets = torch.randint(0, 1000, (16,), device="cuda", generator=gen)
    image_mask = torch.rand(16, 204, device="cuda", generator=gen) < 0.7

    def run(merged: bool, dtype: torch.dtype) -> dict[str, torch.Tensor]:
        model = AlternateVLDiT(config.replace(merged_dit_linears=merged)).cuda().eval()
        model.load_state_dict(reference.state_dict(), strict=True)
        model.to(dtype)
        x, c = tokens.to(dtype).requires_grad_(True), context.to(dtype).requires_grad_(True)
        with torch.autocast("cuda", dtype=torch.bfloat16, enabled=dtype == torch.float32):
            out = model(x, c, buckets, ~image_mask, image_mask)
        out.float().square().mean().backward()
        grads = _release_named_grads(model)
        picked = ("transformer_blocks.1.norm1.linear.weight", "transformer_blocks.1.attn1.to_k.weight",
                  "proj_out_1.weight", "transformer_blocks.0.attn1.to_v.weight")  # fmt: skip
        return {"out": out, "tokens": x.grad, "context": c.grad, **{n: grads[n] for n in picked}}

    exact = run(False, torch.float64)
    plain, merged = run(False, torch.float32), run(True, torch.float32)
    for name, ref in exact.items():
        scale = ref.abs().max()
        error = (merged[name].double() - ref).abs().max() / scale
        baseline = (plain[name].double() - ref).abs().max() / scale
        # bf16 rounding sets both errors (a few 2^-8); the GEMMs differ only in tiling and summation order
        assert error <= 2 * baseline + 2**-10, (name, error, baseline)
