"""LoRA adapters (`gr00t_model._lora`): a fresh adapter changes nothing, only adapters train, adapters save
alone and load onto the base, and merging folds them into the base weights."""

from __future__ import annotations

import pytest
import torch
from gr00t_model import (
    GR00TN16,
    GR00TConfig,
    LoRALinear,
    add_lora,
    load_lora,
    lora_state_dict,
    make_dummy_batch,
    merge_lora,
    save_lora,
)


def _model(seed: int = 0, **overrides) -> GR00TN16:
    torch.manual_seed(seed)
    return GR00TN16(GR00TConfig.preset("tiny", **overrides)).train()


def _loss(model: GR00TN16, batch: dict) -> torch.Tensor:
    gen = torch.Generator().manual_seed(3)
    noise = torch.randn(2, model.config.action_horizon, model.config.max_action_dim, generator=gen)
    t = torch.rand(2, generator=gen) * 0.999
    with torch.random.fork_rng():  # the same dropout draws in every call, the global stream untouched
        torch.manual_seed(5)
        return model(batch, noise=noise, t=t)["loss"]


@pytest.fixture
def batch() -> dict:
    return make_dummy_batch(GR00TConfig.preset("tiny"), batch_size=2, seed=1)


def test_a_fresh_adapter_changes_nothing_and_the_adapters_train_not_their_base(batch) -> None:
    plain, adapted = _model(), _model()
    names = add_lora(adapted, rank=4, alpha=8)
    c = adapted.config
    trainable_llm = c.llm_num_layers if c.tune_llm else c.tune_top_llm_layers
    assert len(names) == c.dit_num_layers * 6 + trainable_llm * 7  # 4 attention + 2 ff; q k v o gate up down
    assert torch.equal(_loss(plain, batch), _loss(adapted, batch))  # B = 0: bit for bit the base model
    loss = _loss(adapted, batch)
    loss.backward()
    for name, module in adapted.named_modules():
        if isinstance(module, LoRALinear):
            assert not module.weight.requires_grad and module.weight.grad is None, name
            assert module.lora_A.grad is not None and module.lora_B.grad is not None, name


def test_adapters_save_alone_and_load_onto_the_base(batch, tmp_path) -> None:
    model = _model()
    add_lora(model, rank=4, alpha=8)
    opt = torch.optim.SGD([p for n, p in model.named_parameters() if "lora_" in n], lr=0.5)
    for _ in range(3):
        opt.zero_grad()
        _loss(model, batch).backward()
        opt.step()
    tuned = _loss(model, batch).detach()
    assert not torch.equal(tuned, _loss(_model(), batch))  # the adapters moved the output
    folder = save_lora(model, tmp_path / "adapter")
    adapter_bytes = sum(p.stat().st_size for p in folder.iterdir())
    state_bytes = sum(t.numel() * 4 for t in lora_state_dict(model).values())
    assert adapter_bytes < state_bytes + 64 * 1024  # only the adapters, in fp32, and a small config

    base = _model()  # the same base weights, from the same seed
    names = load_lora(base, folder)
    assert names == model.lora_config["modules"]
    assert torch.equal(_loss(base, batch), tuned)  # the same adapted model, bit for bit


def test_merging_folds_the_adapters_into_the_base_weights(batch) -> None:
    model = _model()
    count = len(add_lora(model, rank=4, alpha=8))
    with torch.no_grad():
        for module in model.modules():
            if isinstance(module, LoRALinear):
                module.lora_B.normal_(0, 0.05)
    keys = set(_model().state_dict())
    model.eval()
    adapted = _loss(model, batch).detach()
    assert merge_lora(model) == count
    assert not any(isinstance(m, LoRALinear) for m in model.modules())
    assert set(model.state_dict()) == keys  # a plain model again: the release's names, nothing more
    merged = _loss(model, batch).detach()
    # x (W + s B A)^T against x W^T + s (x A^T) B^T: the same products summed in another order (fp32)
    torch.testing.assert_close(merged, adapted, rtol=1e-5, atol=1e-6)


def test_what_cannot_take_an_adapter_is_refused() -> None:
    merged = _model(merged_dit_linears=True)
    with pytest.raises(ValueError, match=r"attn1.to_qkv is a merged linear .*merged_dit_linears=False"):
        add_lora(merged, rank=4, alpha=8)
    model = _model()
    with pytest.raises(ValueError, match="no trainable nn.Linear matches"):
        add_lora(model, rank=4, alpha=8, targets=["nothing.*"])
    add_lora(model, rank=4, alpha=8)
    with pytest.raises(ValueError, match="already has LoRA adapters"):
        add_lora(model, rank=4, alpha=8)
    with pytest.raises(ValueError, match="rank >= 1"):
        add_lora(_model(), rank=0, alpha=8)


def test_a_frozen_linear_is_not_a_default_target() -> None:
    model = _model()
    for layer in model.backbone.language_model.layers:
        layer.requires_grad_(False)
    names = add_lora(model, rank=2, alpha=2)
    assert names and not any(n.startswith("backbone.") for n in names)


def test_a_model_with_adapters_saves_and_loads_whole(batch, tmp_path) -> None:
    from gr00t_model import from_pretrained, save_pretrained

    model = _model()
    add_lora(model, rank=4, alpha=8)
    with torch.no_grad():
        for module in model.modules():
            if isinstance(module, LoRALinear):
                module.lora_B.normal_(0, 0.05)
    model.eval()
    expected = _loss(model, batch).detach()
    save_pretrained(model, tmp_path / "whole")
    loaded = from_pretrained(tmp_path / "whole", strict=True).eval()
    assert loaded.lora_config == model.lora_config
    assert torch.equal(_loss(loaded, batch), expected)
    with pytest.raises(ValueError, match="merge them first"):
        save_pretrained(model, tmp_path / "official", layout="official")
