"""The public split of the forward: `prefix_features` (the frozen part, no gradients) and `forward_from_prefix`
(the trainable part and the loss) compute what `forward` computes, bit for bit on a CPU."""

from __future__ import annotations

import pytest
import torch
from gr00t_model import GR00TN16, GR00TConfig, make_dummy_batch

STEP_KEYS = ("state", "action", "action_mask", "embodiment_id")
"""What forward_from_prefix reads of a batch besides the features (no prompt, no images)."""


def _tiny(**overrides) -> GR00TConfig:
    """The release's precision policy on the tiny shapes (frozen weights bf16, bf16 autocast)."""
    return GR00TConfig.preset("tiny", frozen_dtype="bfloat16", compute_dtype="bfloat16", **overrides)


def _draws(config: GR00TConfig, batch_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(3)
    noise = torch.randn(batch_size, config.action_horizon, config.max_action_dim, generator=gen)
    return noise, torch.rand(batch_size, generator=gen) * 0.999


def _loss_and_grads(model: GR00TN16, run) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    model.zero_grad(set_to_none=True)
    with torch.random.fork_rng():  # the same dropout draws in both calls, the global stream untouched
        torch.manual_seed(5)
        loss = run()["loss"]
        loss.backward()
    return loss.detach(), {n: p.grad.clone() for n, p in model.named_parameters() if p.requires_grad}


@pytest.mark.parametrize("top_layers", [1, 0], ids=["release-trainable-set", "action-head-only"])
def test_forward_from_prefix_features_equals_forward_bitwise(top_layers: int) -> None:
    config = _tiny(tune_top_llm_layers=top_layers)
    model = GR00TN16(config).train()
    batch = make_dummy_batch(config, 3, num_images=2)
    noise, t = _draws(config, 3)

    plain_loss, plain_grads = _loss_and_grads(model, lambda: model(batch, noise=noise, t=t))
    features = model.prefix_features(batch)
    assert set(features) == set(GR00TN16.PREFIX_KEYS)
    assert not features["hidden"].requires_grad and features["hidden"].dtype == torch.bfloat16
    assert model.frozen_depth() == config.llm_num_layers - top_layers
    rest = {key: batch[key] for key in STEP_KEYS}  # the cached path has no prompt and no images
    split_loss, split_grads = _loss_and_grads(
        model, lambda: model.forward_from_prefix(features, rest, noise, t)
    )

    assert torch.equal(plain_loss, split_loss)
    assert plain_grads.keys() == split_grads.keys() and plain_grads
    assert all(torch.equal(plain_grads[n], split_grads[n]) for n in plain_grads)


def test_prefix_features_are_what_a_cache_can_store() -> None:
    config = _tiny()
    model = GR00TN16(config).train()
    batch = make_dummy_batch(config, 2, num_images=2)
    features = model.prefix_features(batch)
    s = batch["input_ids"].shape[1]
    assert features["hidden"].shape == (2, s, config.llm_hidden_size)
    assert torch.equal(features["valid"], batch["attention_mask"].bool())
    assert torch.equal(features["image_mask"], batch["input_ids"] == config.image_token_id)
    # Features of one sample do not depend on which batch computed them (a cache stores them one by one).
    alone = model.prefix_features({key: value[1:] for key, value in batch.items()})
    assert torch.equal(alone["hidden"][0], features["hidden"][1])


@pytest.mark.parametrize("overrides", [{"tune_visual": True}, {"tune_llm": True}])
def test_no_prefix_features_when_the_vision_side_or_embeddings_train(overrides: dict) -> None:
    model = GR00TN16(_tiny(**overrides))
    batch = make_dummy_batch(model.config, 1)
    with pytest.raises(ValueError, match="no frozen prefix"):
        model.prefix_features(batch)
    with pytest.raises(ValueError, match="no frozen prefix"):
        model.forward_from_prefix({"hidden": torch.zeros(1)}, batch)


def test_missing_feature_is_named() -> None:
    model = GR00TN16(_tiny())
    batch = make_dummy_batch(model.config, 1)
    features = model.prefix_features(batch)
    del features["image_mask"]
    with pytest.raises(KeyError, match="image_mask"):
        model.forward_from_prefix(features, batch)
