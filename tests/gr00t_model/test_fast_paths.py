"""The model's fast paths against the plain one: the frozen prefix computed ahead, bf16 matmul weights (vs
fp32 weights under autocast) and compiled blocks. Bitwise where the same kernels run on the same values."""

from __future__ import annotations

import pytest
import torch
from gr00t_model import GR00TN16, GR00TConfig, make_dummy_batch


def _release_tiny(**overrides) -> GR00TConfig:
    """The release's precision policy on the tiny shapes: frozen weights bf16, bf16 autocast."""
    return GR00TConfig.preset("tiny", frozen_dtype="bfloat16", compute_dtype="bfloat16", **overrides)


def _loss_and_grads(model: GR00TN16, batch: dict, noise, t, prefix=None) -> tuple[torch.Tensor, dict]:
    model.zero_grad(set_to_none=True)
    with torch.random.fork_rng():  # the same dropout draws in every call, and the global stream untouched
        torch.manual_seed(5)
        loss = model(batch, noise=noise, t=t, prefix=prefix)["loss"]
        loss.backward()
    grads = {n: p.grad.float() for n, p in model.named_parameters() if p.requires_grad}
    return loss.detach(), grads


def _draws(config: GR00TConfig, batch_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(3)
    noise = torch.randn(batch_size, config.action_horizon, config.max_action_dim, generator=gen)
    return noise, torch.rand(batch_size, generator=gen) * 0.999


def test_frozen_prefix_then_forward_equals_the_plain_forward() -> None:
    config = _release_tiny()
    model = GR00TN16(config).train()
    batch = make_dummy_batch(config, 3, num_images=2)
    noise, t = _draws(config, 3)
    plain_loss, plain_grads = _loss_and_grads(model, batch, noise, t)
    prefix = model.frozen_prefix(batch)
    assert prefix is not None and prefix.layers_done == config.llm_num_layers - config.tune_top_llm_layers
    assert not prefix.hidden.requires_grad  # nothing before it trains: backward never reaches it
    split_loss, split_grads = _loss_and_grads(model, batch, noise, t, prefix=prefix)
    assert torch.equal(plain_loss, split_loss)
    assert all(torch.equal(plain_grads[n], split_grads[n]) for n in plain_grads)


def test_frozen_prefix_reads_no_trainable_weight() -> None:
    config = _release_tiny()
    model = GR00TN16(config).train()
    batch = make_dummy_batch(config, 2, num_images=2)
    before = model.frozen_prefix(batch).hidden
    with torch.no_grad():
        for p in model.parameters():
            if p.requires_grad:
                p.fill_(float("nan"))  # any read of a trainable weight would show as NaN
    assert torch.equal(model.frozen_prefix(batch).hidden, before)


@pytest.mark.parametrize("overrides", [{"tune_visual": True}, {"tune_llm": True}])
def test_no_frozen_prefix_when_the_vision_side_trains(overrides: dict) -> None:
    model = GR00TN16(_release_tiny(**overrides))
    assert model.frozen_prefix(make_dummy_batch(model.config, 1)) is None


@pytest.mark.parametrize("grouped", [False, True], ids=["gathered-tables", "grouped-tables"])
def test_bf16_matmul_weights_compute_what_autocast_computes_from_fp32(grouped: bool) -> None:
    fp32 = GR00TN16(_release_tiny(grouped_embodiment_gemms=grouped)).train()
    bf16 = GR00TN16(_release_tiny(trainable_dtype="bfloat16", grouped_embodiment_gemms=grouped)).train()
    with torch.no_grad():
        for p, q in zip(bf16.parameters(), fp32.parameters()):
            p.copy_(q)  # the same values, rounded to bf16 where bf16 stores them
    matmul = {id(p) for p in bf16.matmul_weights()}
    for name, p in bf16.named_parameters():
        want = torch.bfloat16 if (not p.requires_grad or id(p) in matmul) else torch.float32
        assert p.dtype == want, name
    batch = make_dummy_batch(fp32.config, 3, num_images=2)
    noise, t = _draws(fp32.config, 3)
    loss_a, grads_a = _loss_and_grads(fp32, batch, noise, t)
    loss_b, grads_b = _loss_and_grads(bf16, batch, noise, t)
    # Autocast rounds an fp32 matmul weight to bf16 before every use and casts its bf16 gradient back up
    # exactly: the same bf16 kernels on the same bf16 values, so every number is equal.
    assert torch.equal(loss_a, loss_b)
    assert all(torch.equal(grads_a[n], grads_b[n]) for n in grads_a)


@pytest.mark.parametrize("dropout", [False, True], ids=["dropout-off", "dropout-on"])
def test_compiled_blocks_keep_names_reuse_one_graph_per_block_type_and_match_eager(dropout: bool) -> None:
    import torch._dynamo

    config = GR00TConfig.preset("tiny", frozen_dtype="float32", compute_dtype=None)
    model = GR00TN16(config).train()
    if not dropout:
        model.action_head.model.eval()
    # With dropout on, the DiT draws its keep-masks outside the compiled blocks (one Bernoulli draw), so both
    # runs apply the same masks: the same kernels compute the same numbers either way, and every DiT block of a
    # type reuses one graph although each gets its own row of the masks.
    batch = make_dummy_batch(config, 2, num_images=2)
    noise, t = _draws(config, 2)
    names = list(model.state_dict())
    loss_eager, grads_eager = _loss_and_grads(model, batch, noise, t)
    torch._dynamo.reset()
    torch._dynamo.utils.counters.clear()
    try:
        count = model.compile_blocks(backend="aot_eager")
        assert count == len(model.repeated_blocks()) and list(model.state_dict()) == names
        loss_compiled, grads_compiled = _loss_and_grads(model, batch, noise, t)
        graphs = torch._dynamo.utils.counters["stats"]["unique_graphs"]
    finally:
        model.uncompile_blocks()
        torch._dynamo.reset()
    # vision (the first layer, with no residual add left by a layer before it, has a graph of its own),
    # frozen and trainable LLM layers, DiT self- and cross-attention blocks: one graph per type; and the six
    # once-per-step pieces (patch embedding, connector, image placement, RoPE tables, final norm, vlln)
    assert 0 < graphs <= 12 < count + 6, graphs  # fewer graphs than compiled callables: reuse
    torch.testing.assert_close(loss_compiled, loss_eager, rtol=1e-6, atol=0)
    for name in grads_eager:
        torch.testing.assert_close(grads_compiled[name], grads_eager[name], rtol=1e-5, atol=1e-7)


def test_compile_blocks_gives_inductor_its_options_and_leaves_other_compiles_alone() -> None:
    from unittest import mock

    from gr00t_model._model import INDUCTOR_OPTIONS

    model = GR00TN16(GR00TConfig.preset("tiny"))
    calls = []
    with mock.patch.object(torch, "compile", lambda fn, **kw: calls.append(kw) or fn):
        for options in (
            {},
            {"options": {"triton.multi_kernel": 0}},
            {"backend": "aot_eager"},
            {"mode": "max-autotune"},
        ):
            calls.clear()
            model.compile_blocks(**options)
            model.uncompile_blocks()
            # every block, the six once-per-step pieces and the DiT context cast's gradient sum, with the same options
            assert len(calls) == len(model.repeated_blocks()) + 7 and all(kw == calls[0] for kw in calls)
            given = calls[0]
            assert given["dynamic"] is False
            if not options:
                assert given["options"] == INDUCTOR_OPTIONS and given["options"]["triton.multi_kernel"] == 1
                assert "fx_graph_cache" not in given["options"]  # a second process reuses the compiled graphs
            elif "options" in options:  # the caller's Inductor options win over ours
                assert given["options"] == {**INDUCTOR_OPTIONS, "triton.multi_kernel": 0}
            else:  # another backend, or a mode (torch.compile takes a mode or options, not both)
                assert "options" not in given
