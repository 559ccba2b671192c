"""Activation checkpointing (GR00TConfig.checkpoint_blocks): the same loss and gradients, bit for bit, with
the trainable blocks' activations recomputed in the backward instead of kept."""

from __future__ import annotations

import pytest
import torch
from gr00t_model import GR00TN16, GR00TConfig, make_dummy_batch


def _loss_and_grads(blocks: tuple[str, ...], **overrides) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    torch.manual_seed(0)
    model = GR00TN16(GR00TConfig.preset("tiny", checkpoint_blocks=blocks, **overrides)).train()
    batch = make_dummy_batch(model.config, batch_size=2, seed=1)
    gen = torch.Generator().manual_seed(3)
    noise = torch.randn(2, model.config.action_horizon, model.config.max_action_dim, generator=gen)
    t = torch.rand(2, generator=gen) * 0.999
    with torch.random.fork_rng():  # the same dropout draws in every model, the global stream untouched
        torch.manual_seed(5)
        loss = model(batch, noise=noise, t=t)["loss"]
        loss.backward()
    return loss.detach(), {n: p.grad for n, p in model.named_parameters() if p.grad is not None}


@pytest.mark.parametrize("blocks", [("dit",), ("llm",), ("dit", "llm")])
def test_recomputed_blocks_give_the_same_loss_and_gradients(blocks) -> None:
    loss, grads = _loss_and_grads(())
    again, regrads = _loss_and_grads(blocks)
    assert torch.equal(loss, again)
    assert grads.keys() == regrads.keys() and len(grads) > 0
    for name, grad in grads.items():
        assert torch.equal(grad, regrads[name]), name


def test_dropout_masks_are_recomputed_alike() -> None:
    """The DiT's dropout masks come in drawn: the recomputed forward applies the same ones."""
    loss, grads = _loss_and_grads((), dit_dropout=0.3)
    again, regrads = _loss_and_grads(("dit",), dit_dropout=0.3)
    assert torch.equal(loss, again)
    assert all(torch.equal(g, regrads[n]) for n, g in grads.items())


def test_recomputation_is_used_and_checked(monkeypatch) -> None:
    import gr00t_model._checkpointing as ckpt

    calls = []
    real = ckpt.checkpoint
    monkeypatch.setattr(
        ckpt, "checkpoint", lambda block, *a, **k: calls.append(type(block).__name__) or real(block, *a, **k)
    )
    _loss_and_grads(("dit", "llm"))
    config = GR00TConfig.preset("tiny")
    assert calls.count("TransformerBlock") == config.dit_num_layers
    assert calls.count("LanguageLayer") == config.tune_top_llm_layers  # the trainable layers only
    model = GR00TN16(GR00TConfig.preset("tiny", checkpoint_blocks=["dit", "llm"]))
    assert model.action_head.model.recompute and model.backbone.language_model.recompute
    assert model.config.to_dict()["checkpoint_blocks"] == ["dit", "llm"]
    with pytest.raises(ValueError, match=r"checkpoint_blocks: \['vision'\] are not among"):
        GR00TConfig.preset("tiny", checkpoint_blocks=("vision",))
