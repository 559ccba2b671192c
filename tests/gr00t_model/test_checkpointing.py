"""Activation checkpointing (GR00TConfig.checkpoint_blocks, checkpoint_policy): the same loss and gradients,
bit for bit, with the trainable blocks' activations recomputed in the backward instead of kept, under the full
and the selective policy; the selective one recomputes no GEMM, eager or compiled."""

from __future__ import annotations

import functools
from collections import Counter

import pytest
import torch
from gr00t_model import GR00TN16, GR00TConfig, make_dummy_batch
from torch.utils._python_dispatch import TorchDispatchMode


def _loss_and_grads(
    blocks: tuple[str, ...], model: GR00TN16 | None = None, **overrides
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    if model is None:
        model = _model(blocks, **overrides)
    batch = make_dummy_batch(model.config, batch_size=2, seed=1)
    gen = torch.Generator().manual_seed(3)
    noise = torch.randn(2, model.config.action_horizon, model.config.max_action_dim, generator=gen)
    t = torch.rand(2, generator=gen) * 0.999
    with torch.random.fork_rng():  # the same dropout draws in every model, the global stream untouched
        torch.manual_seed(5)
        loss = model(batch, noise=noise, t=t)["loss"]
        loss.backward()
    return loss.detach(), {n: p.grad for n, p in model.named_parameters() if p.grad is not None}


def _model(blocks: tuple[str, ...], **overrides) -> GR00TN16:
    torch.manual_seed(0)
    return GR00TN16(GR00TConfig.preset("tiny", checkpoint_blocks=blocks, **overrides)).train()


@pytest.mark.parametrize("policy", ["full", "selective"])
@pytest.mark.parametrize("blocks", [("dit",), ("llm",), ("dit", "llm")])
def test_recomputed_blocks_give_the_same_loss_and_gradients(blocks, policy) -> None:
    loss, grads = _loss_and_grads(())
    again, regrads = _loss_and_grads(blocks, checkpoint_policy=policy)
    assert torch.equal(loss, again)
    assert grads.keys() == regrads.keys() and len(grads) > 0
    for name, grad in grads.items():
        assert torch.equal(grad, regrads[name]), name


@pytest.mark.parametrize("policy", ["full", "selective"])
def test_dropout_masks_are_recomputed_alike(policy) -> None:
    """The DiT's dropout masks come in drawn: the recomputed forward applies the same ones."""
    loss, grads = _loss_and_grads((), dit_dropout=0.3)
    again, regrads = _loss_and_grads(("dit",), dit_dropout=0.3, checkpoint_policy=policy)
    assert torch.equal(loss, again)
    assert all(torch.equal(g, regrads[n]) for n, g in grads.items())


def test_recomputation_is_used_and_checked(monkeypatch) -> None:
    import gr00t_model._checkpointing as ckpt

    calls = []
    real = ckpt.checkpoint
    monkeypatch.setattr(
        ckpt, "checkpoint", lambda block, *a, **k: calls.append(type(block).__name__) or real(block, *a, **k)
    )
    _loss_and_grads(("dit", "llm"), checkpoint_policy="full")
    config = GR00TConfig.preset("tiny")
    assert calls.count("TransformerBlock") == config.dit_num_layers
    assert calls.count("LanguageLayer") == config.tune_top_llm_layers  # the trainable layers only
    model = GR00TN16(GR00TConfig.preset("tiny", checkpoint_blocks=["dit", "llm"]))
    assert model.action_head.model.recompute and model.backbone.language_model.recompute
    assert model.config.to_dict()["checkpoint_blocks"] == ["dit", "llm"]
    with pytest.raises(ValueError, match=r"checkpoint_blocks: \['vision'\] are not among"):
        GR00TConfig.preset("tiny", checkpoint_blocks=("vision",))
    with pytest.raises(ValueError, match=r"checkpoint_policy must be one of \('full', 'selective'\)"):
        GR00TConfig.preset("tiny", checkpoint_policy="some")


class _OpsInBackward(TorchDispatchMode):
    """Counts the aten ops the backward runs, by name (the recomputation runs inside the backward)."""

    def __init__(self) -> None:
        super().__init__()
        self.counts: Counter[str] = Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.counts[func.overloadpacket.__name__] += 1
        return func(*args, **(kwargs or {}))


def _backward_ops(model: GR00TN16) -> Counter[str]:
    batch = make_dummy_batch(model.config, batch_size=2, seed=1)
    loss = model(batch)["loss"]
    with _OpsInBackward() as ops:
        loss.backward()
    return ops.counts


def _backward_ops_by_policy(policies: tuple[str, ...], compiled: bool) -> dict[str, Counter[str]]:
    counts = {}
    for policy in policies:
        blocks = () if policy == "none" else ("dit", "llm")
        model = _model(blocks, checkpoint_policy="full" if policy == "none" else policy)
        if compiled:
            torch._dynamo.reset()
            model.compile_blocks(backend="aot_eager")
        try:
            counts[policy] = _backward_ops(model)
            recomputed = model.recomputed_blocks()
            assert all(getattr(b, "checkpoints_itself", False) == compiled for b in recomputed)
            config = model.config
            assert len(recomputed) == (config.dit_num_layers + config.llm_num_layers) * (policy != "none")
        finally:
            model.uncompile_blocks()
            torch._dynamo.reset()
    return counts


ATTENTION = "_scaled_dot_product_flash_attention_for_cpu"


def test_selective_recomputes_no_gemm() -> None:
    """The backward without recompute runs no forward GEMM (Linear layers' addmm) and no norm forward; full
    recompute runs both again; selective runs the norms again but no GEMM and no attention: it kept their
    outputs."""
    counts = _backward_ops_by_policy(("none", "full", "selective"), compiled=False)
    norm = "native_layer_norm"
    assert counts["none"]["addmm"] == 0 and counts["none"][norm] == 0
    assert counts["full"]["addmm"] > 0 and counts["full"][norm] > 0
    assert counts["full"][ATTENTION] > counts["none"][ATTENTION]
    assert counts["selective"]["addmm"] == 0 and counts["selective"][norm] > 0
    assert counts["selective"][ATTENTION] == counts["none"][ATTENTION]


def test_compiled_recompute_follows_its_policy() -> None:
    """compile_blocks compiles the checkpoint with each recomputed block (aot_eager: the partitioner's graphs
    on aten kernels), and the policy holds there: full recompute runs GEMMs, attention and norms again in the
    backward; selective runs cheap ops again (more ops than without recompute) but no GEMM and no attention.
    The backward runs under a TorchDispatchMode (the op counter): a checkpoint around a compiled block would
    recompute through the eager forward there (Dynamo skips frames under such a mode) and fail."""
    counts = _backward_ops_by_policy(("none", "full", "selective"), compiled=True)
    norm = "native_layer_norm"
    assert counts["full"]["addmm"] > 0 and counts["full"][norm] > 0
    assert counts["full"][ATTENTION] > counts["none"][ATTENTION]
    assert counts["selective"]["addmm"] == counts["none"]["addmm"] == 0
    assert counts["selective"][ATTENTION] == counts["none"][ATTENTION]
    assert counts["selective"].total() > counts["none"].total()


@functools.cache  # the baseline (nothing recomputed) once per backend
def _compiled_loss_and_grads(blocks: tuple[str, ...], policy: str, backend: str):
    model = _model(blocks, checkpoint_policy=policy)
    torch._dynamo.reset()
    model.compile_blocks(backend=backend)
    try:
        assert all(getattr(b, "checkpoints_itself", False) for b in model.recomputed_blocks())
        return _loss_and_grads(blocks, model)
    finally:
        model.uncompile_blocks()
        torch._dynamo.reset()


@pytest.mark.parametrize("policy", ["full", "selective"])
@pytest.mark.parametrize("blocks", [("dit",), ("llm",)])
def test_compiled_recompute_gives_the_same_loss_and_gradients(blocks, policy) -> None:
    """compile_blocks with recomputed DiT blocks or Qwen3 layers: the same loss and gradients as the compiled
    blocks without recompute, bit for bit (aot_eager: the same aten kernels on the same inputs)."""
    loss, grads = _compiled_loss_and_grads((), "full", "aot_eager")
    again, regrads = _compiled_loss_and_grads(blocks, policy, "aot_eager")
    assert torch.equal(loss, again)
    assert grads.keys() == regrads.keys() and len(grads) > 0
    for name, grad in grads.items():
        assert torch.equal(grad, regrads[name]), name


@pytest.mark.slow
def test_inductor_compiled_full_recompute_gives_the_same_loss_and_gradients() -> None:
    """As above with Inductor's CPU kernels and both block types recomputed under the full policy."""
    loss, grads = _compiled_loss_and_grads((), "full", "inductor")
    again, regrads = _compiled_loss_and_grads(("dit", "llm"), "full", "inductor")
    assert torch.equal(loss, again)
    assert grads.keys() == regrads.keys() and len(grads) > 0
    for name, grad in grads.items():
        assert torch.equal(grad, regrads[name]), name
