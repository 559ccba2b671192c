"""The whole model on CPU at the tiny preset: training signal, gradients, masks, precision, inference, graph-safety."""

from __future__ import annotations

import pytest
import torch
from gr00t_model import GR00TN16, GR00TConfig, make_dummy_batch


def _trained_names(model: GR00TN16) -> set[str]:
    return {n for n, p in model.named_parameters() if p.requires_grad}


def test_loss_is_finite_and_decreases_on_a_fixed_batch() -> None:
    config = GR00TConfig.preset("tiny")
    model = GR00TN16(config).train()
    batch = make_dummy_batch(config, 2)
    noise = torch.randn(2, config.action_horizon, config.max_action_dim)
    t = torch.rand(2) * config.noise_s
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=3e-3)
    losses = []
    for _ in range(12):
        loss = model(batch, noise=noise, t=t)["loss"]
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        losses.append(loss.item())
    assert all(torch.isfinite(torch.tensor(losses)))
    assert sum(losses[-3:]) / 3 < 0.9 * losses[0], losses


def test_gradients_reach_exactly_the_trainable_parameters() -> None:
    config = GR00TConfig.preset("tiny", tune_top_llm_layers=1, state_dropout_prob=0.5)
    model = GR00TN16(config).train()
    batch = make_dummy_batch(config, 3)
    batch["embodiment_id"] = torch.tensor([20, 20, 20])
    model(batch)["loss"].backward()
    with_grad = {n for n, p in model.named_parameters() if p.grad is not None}
    assert with_grad == _trained_names(model)
    assert all(
        p.grad.abs().sum() > 0
        for n, p in model.named_parameters()
        if p.grad is not None and "mask_token" not in n
    )
    layers = model.backbone.language_model.layers
    assert all(not p.requires_grad for p in layers[0].parameters()) and all(
        p.requires_grad for p in layers[-1].parameters()
    )
    assert not any(p.requires_grad for p in model.backbone.vision_model.parameters())
    assert not any(p.requires_grad for p in model.backbone.mlp1.parameters())
    # Per-embodiment weights: only the batch's slot receives gradient.
    grad = model.action_head.action_decoder.layer2.W.grad
    assert grad[20].abs().sum() > 0 and grad[:20].abs().sum() == 0 and grad[21:].abs().sum() == 0


@pytest.mark.parametrize(
    ("overrides", "trained", "frozen"),
    [
        (
            {"tune_visual": True},
            ["backbone.vision_model.", "backbone.mlp1."],
            ["backbone.language_model.embed_tokens."],
        ),
        (
            {"tune_llm": True},
            ["backbone.language_model.embed_tokens.", "backbone.language_model.layers.0."],
            ["backbone.vision_model."],
        ),
        ({"tune_top_llm_layers": 0}, ["action_head."], ["backbone."]),
        (
            {"tune_diffusion_model": False, "tune_projector": False},
            ["action_head.vlln."],
            ["action_head.model.", "action_head.state_encoder."],
        ),
    ],
)
def test_training_policy_switches(overrides, trained, frozen) -> None:
    model = GR00TN16(
        GR00TConfig.preset("tiny", frozen_dtype="bfloat16", compute_dtype="bfloat16", **overrides)
    )
    names = _trained_names(model)
    for prefix in trained:
        assert any(n.startswith(prefix) for n in names), prefix
    for prefix in frozen:
        assert not any(n.startswith(prefix) for n in names), prefix
    for name, param in model.named_parameters():
        assert param.dtype == (torch.float32 if name in names else torch.bfloat16), name


def test_release_precision_policy_on_cpu() -> None:
    config = GR00TConfig.preset("tiny", frozen_dtype="bfloat16", compute_dtype="bfloat16")
    model = GR00TN16(config).train()
    out = model(make_dummy_batch(config, 2))
    out["loss"].backward()
    assert out["loss"].dtype == torch.float32 and torch.isfinite(out["loss"])
    for name, param in model.named_parameters():
        assert param.dtype == (torch.float32 if param.requires_grad else torch.bfloat16), name
        assert (param.grad is not None) == param.requires_grad and (
            param.grad is None or param.grad.dtype == torch.float32
        )


def test_frozen_dit_stays_in_eval_mode() -> None:
    model = GR00TN16(GR00TConfig.preset("tiny", tune_diffusion_model=False)).train()
    assert (
        model.training and not model.action_head.model.training and model.action_head.state_encoder.training
    )


def test_padded_action_entries_and_padding_tokens_do_not_change_the_loss(fp32_tiny) -> None:
    config = fp32_tiny()
    model = GR00TN16(config).eval()  # no dropout: two forwards are comparable
    batch = make_dummy_batch(config, 2, num_images=2)
    batch["attention_mask"][1, :5] = False  # left padding on row 1
    noise, t = torch.randn(2, config.action_horizon, config.max_action_dim), torch.tensor([0.3, 0.8])
    with torch.no_grad():
        loss = model(batch, noise=noise, t=t)["loss"]
        changed = dict(batch)
        pad = batch["action_mask"] == 0
        changed["action"] = torch.where(pad, torch.randn_like(batch["action"]) * 10, batch["action"])
        changed["input_ids"] = batch["input_ids"].clone()
        changed["input_ids"][1, :5] = torch.randint(8, config.vocab_size, (5,))
        assert torch.equal(model(changed, noise=noise, t=t)["loss"], loss)
        real = dict(batch, action=torch.where(pad, batch["action"], batch["action"] + 0.5))
        assert not torch.equal(model(real, noise=noise, t=t)["loss"], loss)


def test_loss_is_the_masked_velocity_mse(fp32_tiny) -> None:
    config = fp32_tiny()
    model = GR00TN16(config).eval()
    batch = make_dummy_batch(config, 2)
    noise, t = torch.randn(2, config.action_horizon, config.max_action_dim), torch.tensor([0.25, 0.9])
    head = model.action_head
    with torch.no_grad():
        loss = model(batch, noise=noise, t=t)["loss"]
        vl, masks = model._features(batch)
        x_t = (1 - t[:, None, None]) * noise + t[:, None, None] * batch["action"]
        buckets = torch.tensor([250, 900])
        pred = head.velocity(
            vl,
            masks,
            head.encode_state(batch["state"], batch["embodiment_id"]),
            x_t,
            buckets,
            batch["embodiment_id"],
        )
    mask = batch["action_mask"]
    expected = (((pred - (batch["action"] - noise)) ** 2) * mask).sum() / (mask.sum() + 1e-6)
    torch.testing.assert_close(loss, expected)


def test_sampled_flow_time_follows_the_release_distribution() -> None:
    head = GR00TN16(GR00TConfig.preset("tiny")).action_head
    t = head.sample_time(200_000, torch.device("cpu"))
    assert t.min() >= 0 and t.max() < 0.999
    # u ~ Beta(1.5, 1): E[u] = 0.6, P(u <= 0.5) = 0.5^1.5 ->  E[t] = 0.999 * 0.4, P(t >= 0.4995) = 0.354
    assert abs(t.mean().item() - 0.999 * 0.4) < 0.003
    assert abs((t >= 0.999 * 0.5).float().mean().item() - 0.5**1.5) < 0.005
    assert torch.equal(
        head.buckets(torch.tensor([0.0, 0.2499, 0.25, 0.9989])), torch.tensor([0, 249, 250, 998])
    )
    general = GR00TN16(GR00TConfig.preset("tiny", noise_beta_beta=2.0)).action_head.sample_time(
        50_000, torch.device("cpu")
    )
    assert abs(general.mean().item() - 0.999 * (1 - 1.5 / 3.5)) < 0.005


def test_get_action_shapes_steps_and_determinism() -> None:
    config = GR00TConfig.preset("tiny")
    model = GR00TN16(config).eval()
    batch = make_dummy_batch(config, 3)
    noise = torch.randn(3, config.action_horizon, config.max_action_dim)
    actions = model.get_action(batch, noise=noise)
    assert (
        actions.shape == (3, config.action_horizon, config.max_action_dim) and actions.dtype == torch.float32
    )
    assert torch.isfinite(actions).all()
    assert torch.equal(model.get_action(batch, noise=noise), actions)
    assert torch.equal(model.get_action(batch, noise=noise, num_steps=0), noise)
    assert not torch.equal(model.get_action(batch, noise=noise, num_steps=2), actions)
    with pytest.raises(ValueError, match="noise must have shape"):
        model.get_action(batch, noise=noise[:, :4])


def test_euler_inference_uses_buckets_0_250_500_750(fp32_tiny) -> None:
    config = fp32_tiny()
    model = GR00TN16(config).eval()
    batch = make_dummy_batch(config, 2)
    noise = torch.randn(2, config.action_horizon, config.max_action_dim)
    head = model.action_head
    with torch.no_grad():
        vl, masks = model._features(batch)
        state = head.encode_state(batch["state"], batch["embodiment_id"])
        x = noise
        for bucket in (0, 250, 500, 750):
            x = x + 0.25 * head.velocity(
                vl, masks, state, x, torch.full((2,), bucket), batch["embodiment_id"]
            )
    torch.testing.assert_close(model.get_action(batch, noise=noise), x, atol=1e-5, rtol=1e-5)


def test_uint8_frames_equal_normalized_floats(fp32_tiny) -> None:
    config = fp32_tiny()
    model = GR00TN16(config).eval()
    batch = make_dummy_batch(config, 2)
    frames = torch.randint(0, 256, batch["pixel_values"].shape, dtype=torch.uint8)
    noise, t = torch.randn(2, config.action_horizon, config.max_action_dim), torch.tensor([0.5, 0.5])
    with torch.no_grad():
        a = model(dict(batch, pixel_values=frames), noise=noise, t=t)["loss"]
        b = model(dict(batch, pixel_values=(frames.float() / 255 - 0.5) / 0.5), noise=noise, t=t)["loss"]
    assert torch.equal(a, b)


def test_forward_backward_and_inference_need_no_tensor_values() -> None:
    """Graph-safety on CPU: on the meta device any host read (.item(), nonzero, boolean indexing) raises."""
    config = GR00TConfig.preset(
        "tiny", image_size=(84, 84), frozen_dtype="float32", compute_dtype=None, state_dropout_prob=0.3
    )
    with torch.device("meta"):
        model = GR00TN16(config).train()
    batch = {k: v.to("meta") for k, v in make_dummy_batch(config, 2).items()}
    out = model(batch)
    out["loss"].backward()
    assert out["loss"].device.type == "meta" and out["loss"].shape == ()
    assert all(p.grad is not None for p in model.parameters() if p.requires_grad)
    assert model.get_action(batch).shape == (2, config.action_horizon, config.max_action_dim)
    with pytest.raises((RuntimeError, NotImplementedError)):
        batch["input_ids"][batch["input_ids"] > 3]  # the check itself catches a data-dependent op


def test_validate_batch_names_what_is_wrong() -> None:
    config = GR00TConfig.preset("tiny")
    model = GR00TN16(config)
    batch = make_dummy_batch(config, 2, num_images=2)
    model.validate_batch(batch)
    short = dict(batch, input_ids=batch["input_ids"].clone())
    short["input_ids"][1, -1] = 7
    with pytest.raises(ValueError, match=r"\(1, 7\)"):
        model.validate_batch(short)
    with pytest.raises(KeyError, match="state"):
        model.validate_batch({k: v for k, v in batch.items() if k != "state"})
    with pytest.raises(ValueError, match="embodiment_id"):
        model.validate_batch(dict(batch, embodiment_id=torch.tensor([0, 40])))
    with pytest.raises(ValueError, match=r"batch\['action'\] must be"):
        model(dict(batch, action=batch["action"][:, :3], action_mask=batch["action_mask"][:, :3]))


def test_model_has_no_buffers() -> None:
    # from_pretrained skips initialisation by materialising from the meta device; buffers would be lost.
    assert list(GR00TN16(GR00TConfig.preset("tiny")).buffers()) == []
