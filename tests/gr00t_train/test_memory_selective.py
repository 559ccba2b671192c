"""memory.recompute_policy: the selective table entries against a fresh count (and the count against what
torch.utils.checkpoint's cache really holds), the setting's validation and its way into the model, the
budget ladder trying selective before full recompute, and the start-up block naming the policy."""

from __future__ import annotations

import logging
from types import SimpleNamespace

import gr00t_model
import gr00t_model._checkpointing as checkpointing
import pytest
import torch
from _memory_models import CPU
from _memory_models import memory_cfg as _cfg
from _memory_models import planned as _planned
from _memory_models import predicted_gib as _predicted_gib
from _memory_models import tiny_model as _tiny
from gr00t_train import ConfigError
from gr00t_train.memory import budget
from gr00t_train.memory.activations import (
    SAVED_PER_UNIT,
    activation_bytes,
    block_elements,
    count_saved_per_sample,
    mask_bytes,
    shapes_of,
)
from gr00t_train.model import gr00t as adapter


@pytest.mark.parametrize("horizon", [16, 8])
def test_selective_table_matches_a_fresh_count(horizon) -> None:
    """What a selectively recomputed block keeps (its inputs, counted outside it, and the GEMM and attention
    outputs, counted in it) is what the table's selective_* entries say, within the tolerances of the other
    entries (test_memory_plan): 2% for self-attention blocks and LLM layers, 5% for cross-attention blocks,
    whose tokens and context terms are fitted over both horizons."""
    model, loss_at = _tiny(
        action_horizon=horizon, checkpoint_blocks=("dit", "llm"), checkpoint_policy="selective"
    )
    counted = count_saved_per_sample(model, loss_at)
    shapes = shapes_of(model, 2, None)
    action, vlm = shapes.action_tokens * shapes.dit_width, shapes.vlm_tokens * shapes.llm_width
    inputs = {
        "dit_self": SAVED_PER_UNIT["recomputed_dit"] * action,
        "llm": SAVED_PER_UNIT["recomputed_llm"] * vlm,
    }
    inputs["dit_cross"] = inputs["dit_self"]
    selective = block_elements(shapes, {k.removeprefix("selective_"): v for k, v in SAVED_PER_UNIT.items()})
    for kind in ("dit_self", "dit_cross", "llm"):
        assert counted[kind] > 0, kind  # the cache's outputs are seen
        rel = 0.05 if kind == "dit_cross" else 0.02
        assert selective[kind] * 4 == pytest.approx(counted[kind] + 4 * inputs[kind], rel=rel), kind
    # the whole forward: the block inputs sit with the rest, as under full recompute
    masks = mask_bytes(shapes, model.config.dit_ff_mult, model.config.dit_dropout)
    blocks = counted["dit_self"] * shapes.dit_self_blocks + counted["dit_cross"] * shapes.dit_cross_blocks
    total = blocks + counted["llm"] * shapes.llm_layers + counted["rest"]
    predicted = activation_bytes(shapes, 1, ("dit", "llm"), 4, masks=masks, policy="selective")
    transient = max(block_elements(shapes)["dit_cross"], block_elements(shapes)["llm"]) * 4  # the backward's
    assert predicted - transient == pytest.approx(total, rel=0.05)


def test_the_count_sees_what_the_checkpoint_cache_holds(monkeypatch) -> None:
    """The dispatch-mode count of the kept outputs equals, per sample, the bytes of the distinct storages
    torch.utils.checkpoint's selective cache really holds after the forward."""
    caches = []

    def recording_contexts():
        forward, recompute = checkpointing.create_selective_checkpoint_contexts(
            checkpointing._selective_policy
        )
        caches.append(forward.storage)  # torch's cache of the outputs the policy keeps
        return forward, recompute

    monkeypatch.setattr(checkpointing, "selective_contexts", recording_contexts)
    model, loss_at = _tiny(checkpoint_blocks=("dit", "llm"), checkpoint_policy="selective")
    held = []
    for batch in (1, 2):
        caches.clear()
        loss = loss_at(batch)  # holds the graph, and with it the caches
        leaves = [t for cache in caches for t in _tensors_in(cache)]
        storages = {
            t.untyped_storage().data_ptr(): t.untyped_storage().nbytes()
            for t in leaves
            if isinstance(t, torch.Tensor)
        }
        held.append(sum(storages.values()))
        del loss
    counted = count_saved_per_sample(model, loss_at)
    shapes = shapes_of(model, 2, None)
    blocks = counted["dit_self"] * shapes.dit_self_blocks + counted["dit_cross"] * shapes.dit_cross_blocks
    assert held[1] - held[0] > 0
    assert blocks + counted["llm"] * shapes.llm_layers == pytest.approx(held[1] - held[0], rel=0.01)


def _tensors_in(held) -> list[torch.Tensor]:
    """The tensors in torch's selective-checkpoint cache (nested dicts and lists of version-checking
    wrappers, whose layout varies between torch versions)."""
    held = getattr(held, "val", held)
    if isinstance(held, torch.Tensor):
        return [held]
    if isinstance(held, dict):
        held = list(held.values())
    if isinstance(held, (list, tuple)):
        return [t for item in held for t in _tensors_in(item)]
    return []


def test_selective_keeps_between_none_and_full(tmp_path) -> None:
    """The activation model's order for a sample of n1.6-3b's shapes: nothing recomputed keeps most, the
    selective policy less, the full policy least."""
    _, shapes = budget.meta_model(_cfg(tmp_path, "model.preset=n1.6-3b"), CPU)
    none, selective, full = (
        activation_bytes(shapes, 1, ("dit", "llm") if p else (), 4, policy=p or "full")
        for p in (None, "selective", "full")
    )
    assert none > selective > full


def test_the_setting_is_validated_and_reaches_the_model(tmp_path) -> None:
    with pytest.raises(ConfigError, match="memory.recompute_policy"):
        _cfg(tmp_path, "memory.recompute_policy=some")
    tokenizer = gr00t_model.load_tokenizer(None)
    for given, ran in (("auto", "full"), ("full", "full"), ("selective", "selective")):
        cfg = _cfg(tmp_path, f"memory.recompute_policy={given}", "memory.recompute=[dit]")
        fields = adapter.model_overrides(cfg, CPU, tokenizer)
        assert fields["checkpoint_policy"] == ran and fields["checkpoint_blocks"] == ("dit",)


def test_the_ladder_tries_selective_before_full(tmp_path, monkeypatch) -> None:
    """memory.recompute_policy=auto: the DiT selectively first; where that is not enough, later steps (the
    LLM selectively, then everything fully). A policy you set is the only one tried, and kept."""
    monkeypatch.setattr(budget, "int8_moments_available", lambda: False)
    plain = _predicted_gib(tmp_path)
    selective = _predicted_gib(tmp_path, "memory.recompute=[dit]", "memory.recompute_policy=selective")
    full = _predicted_gib(tmp_path, "memory.recompute=[dit]", "memory.recompute_policy=full")
    assert plain > selective > full
    cfg, plan = _planned(tmp_path, (selective + 0.01) / budget.HEADROOM)
    assert plan.techniques == ["recompute dit (selective)"]
    assert cfg.memory.recompute == ["dit"] and cfg.memory.recompute_policy == "selective"
    both = _predicted_gib(tmp_path, "memory.recompute=[dit,llm]", "memory.recompute_policy=full")
    cfg, plan = _planned(tmp_path, (both + 0.01) / budget.HEADROOM)
    assert plan.techniques[-1] == "recompute fully" and cfg.memory.recompute_policy == "full"
    assert cfg.memory.recompute == ["dit", "llm"]
    cfg, plan = _planned(tmp_path, (full + 0.01) / budget.HEADROOM, "memory.recompute_policy=full")
    assert plan.techniques == ["recompute dit"] and "memory.recompute_policy=full" in plan.kept
    steps, _ = budget.ladder(_cfg(tmp_path, "memory.recompute_policy=selective"))
    names = [name for name, _ in steps]
    assert "recompute fully" not in names and "recompute dit (selective)" in names


def test_the_start_up_block_names_the_policy(tmp_path, monkeypatch, caplog) -> None:
    monkeypatch.setattr(budget, "int8_moments_available", lambda: False)
    selective = _predicted_gib(tmp_path, "memory.recompute=[dit]", "memory.recompute_policy=selective")
    with caplog.at_level(logging.INFO, logger="gr00t_train.memory.budget"):
        _, plan = _planned(tmp_path, (selective + 0.01) / budget.HEADROOM)
    assert "activation recompute: dit (selective: inputs, GEMM and attention outputs)" in caplog.text
    assert plan.facts(None)["recompute"] == plan.recompute
    _, plan = _planned(tmp_path, 400)
    assert plan.recompute == "none" and "activation recompute: none" in plan.block()
    env = SimpleNamespace(device=CPU, world_size=1, is_main=False)
    given = _cfg(tmp_path, "model.preset=n1.6-3b", "memory.recompute=[llm]", "memory.budget_gib=400")
    assert budget.plan_for_budget(given, env)[1].recompute == "llm (full: inputs only)"
