"""The gr00t_model side of a run: model building, loss with pre-drawn randomness, checkpoints, resume."""

from __future__ import annotations

import json

import gr00t_model
import gr00t_train
import pytest
import torch
from _gr00t_sources import DummySource
from gr00t_train import ConfigError, Trainer
from gr00t_train.model import gr00t as adapter

CPU = torch.device("cpu")


@pytest.fixture(scope="module")
def tokenizer():
    return gr00t_model.load_tokenizer(None)


def _cfg(tmp_path, *overrides):
    base = gr00t_train.load_config(
        preset="demo",
        overrides=[
            "device=cpu",
            "optimizations.comm=ddp",
            f"output_dir={tmp_path / 'run'}",
            "logging.progress=false",
            "logging.plots=false",
            "logging.every=2",
            "data.batch_size=2",
        ],
    )
    return gr00t_train.apply_overrides(base, list(overrides))


def _parts(cfg, tokenizer):
    model = adapter.build_model(cfg, CPU, tokenizer)
    flops, tokens = adapter.flops_and_tokens(model.config, 2, None)
    return gr00t_train.TrainParts(
        model=model,
        loss_fn=adapter.gr00t_loss,
        data=DummySource(model.config, cfg.data.batch_size),
        save_model=adapter.save_model,
        load_model=adapter.load_model_in_place,
        draw=adapter.make_draw(model, cfg.data.batch_size, CPU),
        flops_per_sample=flops,
        tokens_per_sample=tokens,
    )


def test_build_model_follows_the_config(tmp_path, tokenizer) -> None:
    cfg = _cfg(tmp_path, "model.action_horizon=8", "model.tune_top_llm_layers=0", "precision=bf16")
    model = adapter.build_model(cfg, CPU, tokenizer)
    c = model.config
    assert c.action_horizon == 8 and c.tune_top_llm_layers == 0 and c.compute_dtype == "bfloat16"
    assert c.image_token_id == tokenizer.convert_tokens_to_ids("<IMG_CONTEXT>")
    assert not any(p.requires_grad for p in model.backbone.language_model.parameters())
    same = adapter.build_model(cfg, CPU, tokenizer)  # seeded: identical on every rank
    assert all(torch.equal(a, b) for a, b in zip(model.parameters(), same.parameters()))
    fp32 = adapter.build_model(_cfg(tmp_path, "precision=fp32"), CPU, tokenizer)
    assert fp32.config.compute_dtype is None and fp32.config.frozen_dtype == "float32"


def test_bad_model_settings_name_the_field(tmp_path, tokenizer) -> None:
    with pytest.raises(ConfigError, match="model.preset: unknown preset 'huge'"):
        adapter.build_model(_cfg(tmp_path, "model.preset=huge"), CPU, tokenizer)
    with pytest.raises(ConfigError, match="model.tokenizer: starting from model.checkpoint needs"):
        adapter.build_model(_cfg(tmp_path, f"model.checkpoint={tmp_path}"), CPU, tokenizer)


def test_checkpoints_load_with_gr00t_model_and_in_place(tmp_path, tokenizer) -> None:
    cfg = _cfg(tmp_path)
    model = adapter.build_model(cfg, CPU, tokenizer)
    adapter.save_model(model, tmp_path)
    loaded = gr00t_model.from_pretrained(tmp_path)
    assert all(torch.equal(a, b) for a, b in zip(model.state_dict().values(), loaded.state_dict().values()))
    other = adapter.build_model(_cfg(tmp_path, "seed=7"), CPU, tokenizer)
    pointers = [p.data_ptr() for p in other.parameters()]
    adapter.load_model_in_place(other, tmp_path)
    assert [p.data_ptr() for p in other.parameters()] == pointers  # parameters kept, values replaced
    assert all(torch.equal(a, b) for a, b in zip(model.state_dict().values(), other.state_dict().values()))


def test_flops_and_tokens_come_from_the_counter(tokenizer) -> None:
    config = gr00t_model.GR00TConfig.preset("n1.6-3b")
    flops, tokens = adapter.flops_and_tokens(config, 2, None)
    assert 1.2e12 < flops < 2.0e12  # about 1.45 TF for two 252x252 cameras (reference section 4)
    assert tokens == pytest.approx(28 + 2 * (7 + 81) + 51)


def test_tiny_model_trains_and_resumes_bit_exactly(tmp_path, env, tokenizer) -> None:
    full = _cfg(tmp_path / "a", "steps=6")
    Trainer(full, _parts(full, tokenizer), env).fit()
    reference = [json.loads(line)["loss"] for line in (tmp_path / "a/run/metrics.jsonl").open()]
    assert len(reference) == 6 and all(0 < x < 10 for x in reference)

    # Train again with a checkpoint at step 3, then resume from it: steps 4-6 must repeat bit for bit.
    first = _cfg(tmp_path / "b", "steps=6", "checkpoint.every=3")
    Trainer(first, _parts(first, tokenizer), env).fit()
    step3 = tmp_path / "b/run/checkpoints/step_000003"
    resumed = _cfg(tmp_path / "b", "steps=6", f"checkpoint.resume={step3}")
    Trainer(resumed, _parts(resumed, tokenizer), env).fit()
    rows = [json.loads(line) for line in (tmp_path / "b/run/metrics.jsonl").open()]
    assert [r["step"] for r in rows] == [1, 2, 3, 4, 5, 6]  # the first run's steps 4-6 were replaced
    assert [r["loss"] for r in rows] == reference  # the flow-matching noise and time are restored too
    row = rows[-1]
    assert row["tokens_per_s"] == pytest.approx(row["samples_per_s"] * (28 + 2 * (7 + 4) + 17))


def test_fp8_frozen_trains_and_saves_plain_weights(tmp_path, env, tokenizer) -> None:
    """optimizations.fp8_frozen: the frozen prefix's linears become FP8 (CPU runs _scaled_mm too), the run
    trains, and its checkpoint holds the ordinary weights (it loads into a model without FP8)."""
    from gr00t_model._frozen_linear import FrozenLinear

    cfg = _cfg(tmp_path, "steps=3", "optimizations.fp8_frozen=true")
    parts = _parts(cfg, tokenizer)
    assert any(isinstance(m, FrozenLinear) and m.fp8 for m in parts.model.backbone.vision_model.modules())
    Trainer(cfg, parts, env).fit()
    losses = [json.loads(line)["loss"] for line in (tmp_path / "run/metrics.jsonl").open()]
    assert len(losses) == 3 and all(0 < x < 10 for x in losses)
    plain = adapter.build_model(_cfg(tmp_path), CPU, tokenizer)
    adapter.load_model_in_place(plain, tmp_path / "run/checkpoints/step_000003")
    assert all(
        torch.equal(a, b) for a, b in zip(parts.model.state_dict().values(), plain.state_dict().values())
    )


def test_fp8_frozen_needs_a_frozen_vision_side(tmp_path, tokenizer) -> None:
    cfg = _cfg(tmp_path, "optimizations.fp8_frozen=true", "model.tune_visual=true")
    with pytest.raises(ConfigError, match="optimizations.fp8_frozen: the vision tower or connector trains"):
        adapter.build_model(cfg, CPU, tokenizer)
