"""memory.budget_gib: the predictor against the real tensors of a tiny run, the activation table against a
fresh saved-tensor count, the chooser's decisions, its refusal, the start-up block and summary.json."""

from __future__ import annotations

import json
import logging
from types import SimpleNamespace

import gr00t_model
import gr00t_train
import pytest
import torch
from _memory_models import CPU
from _memory_models import memory_cfg as _cfg
from _memory_models import planned as _planned
from _memory_models import predicted_gib as _predicted_gib
from _memory_models import tiny_model as _tiny
from gr00t_train import ConfigError, Trainer
from gr00t_train._comm import adam_moments
from gr00t_train.config.optimizations import resolve_optimizations
from gr00t_train.memory import budget
from gr00t_train.memory.activations import SAVED_PER_UNIT, count_saved_per_sample, shapes_of
from gr00t_train.memory.plan import GiB, state_bytes
from gr00t_train.model import gr00t as adapter

FULL = "memory.recompute_policy=full"
"""The ladder without selective recompute (test_memory_selective.py tests the one with it)."""


class Source:
    def __init__(self, config, batch_size, device=CPU):
        self.batch = gr00t_model.make_dummy_batch(config, batch_size, num_images=2, seed=0, device=device)

    def __next__(self):
        return dict(self.batch, episode_index=torch.zeros(self.batch["state"].shape[0], dtype=torch.long))

    def state_dict(self):
        return {}

    def load_state_dict(self, state):
        pass

    def timings(self):
        return {}

    def close(self):
        pass


@pytest.mark.parametrize(
    "comm, moments", [("zero1_overlap", "fp32"), ("overlap", "fp32"), ("zero1_overlap", "int8")]
)
def test_states_are_the_trained_tensors_bytes(tmp_path, env, comm, moments) -> None:
    """Weights, masters, moments and gradient buffers predicted from the model equal, byte for byte, what
    the trainer allocated after a step (ZeRO-1 buffers and shards, or torch AdamW's per-parameter state;
    8-bit moments: vla-overlap's codes and per-block scales in its flat step)."""
    _check_states(
        tmp_path, env, CPU, "steps=1", f"optimizations.comm={comm}", f"memory.adam_moments={moments}"
    )


@pytest.mark.gpu
@pytest.mark.parametrize("accum", [1, 2])
def test_states_on_cuda_are_the_trained_tensors_bytes(tmp_path, accum) -> None:
    """The CUDA path: bf16 weights, the flat step's whole-shard moments, remainders, bf16 gradient buffers
    at one microbatch and fp32 ones with accumulation, the frozen prefix's prepared copies."""
    gpu_env = gr00t_train.init_distributed("cuda")
    try:
        # compile off: this test's parts offer no blocks to compile, and compiling allocates no state
        _check_states(tmp_path, gpu_env, torch.device("cuda"), "steps=1", "device=cuda",
                      f"optim.grad_accum={accum}", "data.batch_size=1", "optimizations.compile=off")  # fmt: skip
    finally:
        gr00t_train.shutdown_distributed(gpu_env)


def _check_states(tmp_path, env, device, *overrides) -> None:
    cfg = _cfg(tmp_path, *overrides, device=device)
    tokenizer = gr00t_model.load_tokenizer(None)
    model = adapter.build_model(cfg, device, tokenizer)
    predicted = state_bytes(model, cfg, world_size=1, device_type=device.type, moments=adam_moments(cfg))
    batch = cfg.data.batch_size
    parts = gr00t_train.TrainParts(
        model=model, loss_fn=adapter.gr00t_loss, data=Source(model.config, batch, device),
        save_model=adapter.save_model, load_model=adapter.load_model_in_place,
        draw=adapter.make_draw(model, batch, device), flops_per_sample=1.0, tokens_per_sample=1.0,
    )  # fmt: skip
    trainer = Trainer(cfg, parts, env)
    trainer.fit()
    assert predicted == _allocated(trainer, model)
    assert predicted["moments"] > 0 and predicted["gradients"] > 0


def _allocated(trainer, model) -> dict:
    """The state tensors the trainer allocated, by component (each storage once)."""
    wrapper, optimizer = trainer.comm.module, trainer.comm.optimizer
    moments = {}
    for state in optimizer.state.values():
        for key in ("exp_avg", "exp_avg_sq"):
            if key in state:
                moments[state[key].untyped_storage().data_ptr()] = state[key].untyped_storage().nbytes()
    for flat in getattr(getattr(optimizer, "flat", None), "buckets", []):  # the flat step's own buffers
        for key in ("exp_avg", "exp_avg_sq", "exp_avg_scale", "exp_avg_sq_scale"):
            if flat.get(key) is not None:
                moments[flat[key].untyped_storage().data_ptr()] = flat[key].untyped_storage().nbytes()
    grads = sum(t.numel() * t.element_size() for t in wrapper._grads.data)
    masters = 0
    if hasattr(wrapper, "_gather") and wrapper._gather is not None:  # ZeRO-1
        weights = sum(t.numel() * t.element_size() for t in wrapper._gather.data)
        shards = [wrapper._gather.shard_view(b) for b in range(len(optimizer.masters))]
        masters = sum(
            m.numel() * m.element_size()
            for m, s in zip(optimizer.masters, shards)
            if m.data_ptr() != s.data_ptr()
        )
        if optimizer.flat is not None:
            masters += sum(b["rem"].numel() * 2 for b in optimizer.flat.buckets if b["rem"] is not None)
        else:  # torch's AdamW reads the shard's gradient widened to fp32 where the buffer is not
            grads += sum(g.numel() * g.element_size() for g in optimizer._grad_shards if g.dtype == torch.float32
                         and g.data_ptr() not in {t.data_ptr() for t in wrapper._grads.data})  # fmt: skip
    else:
        weights = sum(p.numel() * p.element_size() for p in model.parameters() if p.requires_grad)
    frozen = {}
    for t in [*(p for p in model.parameters() if not p.requires_grad), *model.buffers()]:
        frozen[t.untyped_storage().data_ptr()] = t.numel() * t.element_size()
    for m in model.modules():
        for name in ("prepared_weight", "prepared_bias", "fp8_weight", "fp8_scale"):
            t = getattr(m, name, None)
            if t is not None:
                frozen[t.untyped_storage().data_ptr()] = t.numel() * t.element_size()
    return {
        "frozen_weights": sum(frozen.values()), "trainable_weights": weights, "masters": masters,
        "moments": sum(moments.values()), "gradients": grads,
    }  # fmt: skip


@pytest.mark.parametrize("horizon", [16, 8])
def test_activation_table_matches_a_fresh_saved_tensor_count(horizon) -> None:
    """The table's constants predict what autograd saves per sample in every kind of block (eager fp32 on a
    CPU, counted again here), at the horizon they were counted at and at another (the tokens scale)."""
    from gr00t_train.memory.activations import activation_bytes, block_elements, mask_bytes

    model, loss_at = _tiny(action_horizon=horizon)
    counted = count_saved_per_sample(model, loss_at)
    shapes = shapes_of(model, 2, None)
    per = block_elements(shapes, SAVED_PER_UNIT)
    masks = mask_bytes(shapes, model.config.dit_ff_mult, model.config.dit_dropout)
    for kind in ("dit_self", "dit_cross", "llm"):
        # self and llm within 2%: the table rounds the counts to 0.1 element per unit. Cross blocks within 5%:
        # on a CPU their masked attention keeps its probabilities (heads x action x VL tokens), which the
        # table folds into the context term counted at horizon 16 (at 8: 3% fewer)
        assert per[kind] * 4 == pytest.approx(counted[kind], rel=0.05 if kind == "dit_cross" else 0.02)
    # the rest: the VLM- and action-token parts fitted over both horizons, so 10%
    assert per["rest"] * 4 + masks == pytest.approx(counted["rest"], rel=0.10)
    blocks = counted["dit_self"] * shapes.dit_self_blocks + counted["dit_cross"] * shapes.dit_cross_blocks
    total = blocks + counted["llm"] * shapes.llm_layers + counted["rest"]
    assert activation_bytes(shapes, 1, (), 4, masks=masks) == pytest.approx(total, rel=0.05)


def test_recomputed_blocks_keep_their_inputs() -> None:
    """With dit and llm fully recomputed, the forward keeps what the table's recomputed_* entries say (counted
    outside the blocks: torch.utils.checkpoint saves their inputs), far less than without."""
    from gr00t_train.memory.activations import block_elements, mask_bytes

    model, loss_at = _tiny(checkpoint_blocks=("dit", "llm"), checkpoint_policy="full")
    counted = count_saved_per_sample(model, loss_at)
    shapes = shapes_of(model, 2, None)
    assert counted["dit_self"] == counted["dit_cross"] == counted["llm"] == 0
    inputs = 4 * (
        (shapes.dit_self_blocks + shapes.dit_cross_blocks)
        * SAVED_PER_UNIT["recomputed_dit"] * shapes.action_tokens * shapes.dit_width
        + shapes.llm_layers * SAVED_PER_UNIT["recomputed_llm"] * shapes.vlm_tokens * shapes.llm_width
    )  # fmt: skip
    rest = block_elements(shapes)["rest"] * 4 + mask_bytes(shapes, 4, model.config.dit_dropout)
    assert inputs + rest == pytest.approx(counted["rest"], rel=0.10)


def test_the_chooser_adds_techniques_cheapest_first(tmp_path, monkeypatch) -> None:
    monkeypatch.setattr(budget, "int8_moments_available", lambda: False)
    plain = _predicted_gib(tmp_path)
    dit = _predicted_gib(tmp_path, "memory.recompute=[dit]")
    both = _predicted_gib(tmp_path, "memory.recompute=[dit,llm]")
    assert plain > dit > both
    assert _planned(tmp_path, None) == (_planned(tmp_path, None)[0], None)  # no budget: no plan
    cfg, plan = _planned(tmp_path, plain / budget.HEADROOM + 0.1, FULL)
    assert plan.techniques == [] and cfg.memory.recompute == []
    cfg, plan = _planned(tmp_path, (dit + plain) / 2 / budget.HEADROOM, FULL)
    assert plan.techniques == ["recompute dit"] and cfg.memory.recompute == ["dit"]
    cfg, plan = _planned(tmp_path, (both + dit) / 2 / budget.HEADROOM, FULL)
    assert plan.techniques == ["recompute dit", "recompute llm"] and cfg.memory.recompute == ["dit", "llm"]
    assert (cfg.data.batch_size, cfg.optim.grad_accum) == (16, 1)
    assert plan.prediction.total <= budget.HEADROOM * plan.budget_gib * GiB


def test_int8_moments_come_before_recomputing_the_llm(tmp_path, monkeypatch) -> None:
    monkeypatch.setattr(budget, "int8_moments_available", lambda: True)
    zero1 = "optimizations.comm=zero1_overlap"  # the sharded optimizer holds the moments
    int8 = _predicted_gib(tmp_path, zero1, "memory.adam_moments=int8")
    both = _predicted_gib(tmp_path, zero1, "memory.adam_moments=int8", "memory.recompute=[dit]")
    dit = _predicted_gib(tmp_path, zero1, "memory.recompute=[dit]")
    assert both + 0.01 < min(int8, dit)  # neither alone fits
    cfg, plan = _planned(tmp_path, (both + 0.01) / budget.HEADROOM, zero1, FULL)
    assert plan.techniques == ["recompute dit", "8-bit AdamW moments"]
    assert cfg.memory.adam_moments == "int8" and plan.moments == "int8" and cfg.memory.recompute == ["dit"]


def test_a_technique_a_later_one_makes_unneeded_is_left_out(tmp_path, monkeypatch) -> None:
    """Recomputing the DiT came first but does not fit; with 8-bit moments added, the moments alone fit."""
    monkeypatch.setattr(budget, "int8_moments_available", lambda: True)
    zero1 = "optimizations.comm=zero1_overlap"
    int8 = _predicted_gib(tmp_path, zero1, "memory.adam_moments=int8")
    assert int8 < _predicted_gib(tmp_path, zero1, "memory.recompute=[dit]")
    cfg, plan = _planned(tmp_path, (int8 + 0.01) / budget.HEADROOM, zero1, FULL)
    assert plan.techniques == ["8-bit AdamW moments"] and cfg.memory.recompute == []


@pytest.mark.parametrize(
    "budget_gib, techniques",
    [
        (48, []),
        (32, ["no master remainders", "recompute dit (selective)"]),
        (24, ["no master remainders", "8-bit AdamW moments"]),
    ],
)
def test_n16_3b_on_an_h200_class_gpu(tmp_path, monkeypatch, budget_gib, techniques) -> None:
    """The benchmark's budgets as the planner sees them on a CUDA device (planned on the meta device, so a
    CPU host can check them): the release trainable set at batch 16, bf16 weights, the flat step."""
    monkeypatch.setattr(budget, "int8_moments_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (9, 0))
    cuda = torch.device("cuda")
    sets = ["data.batch_size=16", f"output_dir={tmp_path}", f"memory.budget_gib={budget_gib}"]
    cfg = resolve_optimizations(gr00t_train.load_config(overrides=sets), cuda)[0]  # the defaults
    env = SimpleNamespace(device=cuda, world_size=1, is_main=False)
    planned, plan = budget.plan_for_budget(cfg, env)
    assert plan.techniques == techniques
    assert plan.prediction.total <= budget.HEADROOM * budget_gib * GiB
    assert planned.optimizations.param_remainders == ("no master remainders" not in techniques)
    assert (planned.data.batch_size, planned.optim.grad_accum) == (16, 1)


def test_a_smaller_microbatch_keeps_the_effective_batch(tmp_path, monkeypatch) -> None:
    """fp32 moments on a CPU model: after both recomputes only the microbatch is left to shrink."""
    monkeypatch.setattr(budget, "int8_moments_available", lambda: False)
    both = _predicted_gib(tmp_path, "memory.recompute=[dit,llm]")
    two = _predicted_gib(tmp_path, "memory.recompute=[dit,llm]", "data.batch_size=4", "optim.grad_accum=4")
    assert two < both
    cfg, plan = _planned(tmp_path, (two + 0.001) / budget.HEADROOM, FULL)
    assert plan.techniques[-1] == f"microbatch {cfg.data.batch_size} x {cfg.optim.grad_accum}"
    assert sum(name.startswith("microbatch") for name in plan.techniques) == 1
    assert cfg.data.batch_size * cfg.optim.grad_accum == 16 and cfg.optim.grad_accum > 1


def test_nothing_fits_names_the_budget(tmp_path, monkeypatch) -> None:
    monkeypatch.setattr(budget, "int8_moments_available", lambda: False)
    with pytest.raises(ConfigError, match=r"memory.budget_gib: 4 GiB per GPU cannot hold this run") as err:
        _planned(tmp_path, 4)
    assert "moments" in str(err.value) and "model.lora.rank" in str(err.value)
    names = "recompute dit (selective), recompute llm (selective), recompute fully, microbatch 1 x 16"
    assert f"({names})" in str(err.value)


def test_settings_you_gave_are_kept(tmp_path, monkeypatch) -> None:
    """memory.recompute and optim.grad_accum given: the planner neither adds recomputes nor changes the
    microbatch, even where it then cannot fit the budget."""
    monkeypatch.setattr(budget, "int8_moments_available", lambda: False)
    given = ("memory.recompute=[llm]", "optim.grad_accum=2")
    as_set = _predicted_gib(tmp_path, *given)
    cfg, plan = _planned(tmp_path, (as_set + 0.01) / budget.HEADROOM, *given)
    assert cfg.memory.recompute == ["llm"] and cfg.optim.grad_accum == 2 and cfg.data.batch_size == 16
    assert plan.techniques == [] and plan.kept == ["memory.recompute=['llm']", "optim.grad_accum=2"]
    assert "kept as you set it: optim.grad_accum=2" in plan.block()
    with pytest.raises(ConfigError, match="memory.budget_gib: .* its smallest plan \\(as set\\)"):
        _planned(tmp_path, (as_set - 0.5) / budget.HEADROOM, *given)


def test_int8_asked_for_without_vla_overlap_support_is_refused(tmp_path, monkeypatch) -> None:
    monkeypatch.setattr(budget, "int8_moments_available", lambda: False)
    with pytest.raises(ConfigError, match="memory.adam_moments: int8 needs"):
        _planned(tmp_path, None, "memory.adam_moments=int8")


def test_int8_moments_need_zero1(tmp_path) -> None:
    with pytest.raises(ConfigError, match="memory.adam_moments: int8 moments live in ZeRO-1"):
        _planned(tmp_path, None, "optimizations.comm=overlap", "memory.adam_moments=int8")


def test_the_start_up_block_and_summary_fields(tmp_path, monkeypatch, caplog) -> None:
    monkeypatch.setattr(budget, "int8_moments_available", lambda: False)
    with caplog.at_level(logging.INFO, logger="gr00t_train.memory.budget"):
        _, plan = _planned(tmp_path, 200)
    text = caplog.text
    assert "memory budget 200 GiB (memory.budget_gib): none needed; microbatch 16 x 1" in text
    for name in ("frozen weights", "trainable weights", "masters", "moments", "gradients", "activations"):
        assert name in text
    assert "not used: optimizations.fp8_frozen" in text
    facts = plan.facts(12.5)
    assert facts["predicted_gib"]["total"] == pytest.approx(plan.prediction.total / GiB, abs=0.01)
    assert facts["measured_peak_run_gib"] == 12.5 and facts["measured_peak_step1_gib"] is None
    assert json.loads(json.dumps(facts)) == facts


def test_the_trainer_records_the_plan_in_summary_json(tmp_path, env, monkeypatch) -> None:
    """A trainer given a plan (run_training sets it) writes it into summary.json as memory_plan."""
    monkeypatch.setattr(budget, "int8_moments_available", lambda: False)
    _, plan = _planned(tmp_path, 200)
    cfg = _cfg(tmp_path, "steps=1")
    model = adapter.build_model(cfg, CPU, gr00t_model.load_tokenizer(None))
    parts = gr00t_train.TrainParts(
        model=model, loss_fn=adapter.gr00t_loss, data=Source(model.config, 2),
        save_model=adapter.save_model, load_model=adapter.load_model_in_place,
        draw=adapter.make_draw(model, 2, CPU), flops_per_sample=1.0, tokens_per_sample=1.0,
    )  # fmt: skip
    trainer = Trainer(cfg, parts, env)
    trainer.memory_plan = plan
    trainer.fit()
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["memory_plan"] == json.loads(json.dumps(plan.facts(None)))
    assert summary["memory_plan"]["predicted_gib"]["total"] > 0


def test_int8_moments_resume_bit_for_bit(tmp_path, env) -> None:
    """memory.adam_moments=int8 (the torch form of vla-overlap's flat step on a CPU): a run resumed from its
    step-2 checkpoint repeats steps 3-4 of the uninterrupted run bit for bit (the checkpoint holds the
    decoded moments, which encode back to the same codes)."""
    tokenizer = gr00t_model.load_tokenizer(None)

    def run(folder, *overrides) -> list[float]:
        cfg = _cfg(folder, "optimizations.comm=zero1_overlap", "memory.adam_moments=int8", "logging.every=1",
                   "steps=4", *overrides)  # fmt: skip
        model = adapter.build_model(cfg, CPU, tokenizer)
        parts = gr00t_train.TrainParts(
            model=model, loss_fn=adapter.gr00t_loss, data=Source(model.config, 2),
            save_model=adapter.save_model, load_model=adapter.load_model_in_place,
            draw=adapter.make_draw(model, 2, CPU), flops_per_sample=1.0, tokens_per_sample=1.0,
        )  # fmt: skip
        trainer = Trainer(cfg, parts, env)
        trainer.fit()
        assert trainer.comm.optimizer.moments == "int8"
        return [
            json.loads(line)["loss"] for line in (folder / "run/metrics.jsonl").open() if '"loss"' in line
        ]

    reference = run(tmp_path / "a")
    run(tmp_path / "b", "checkpoint.every=2")
    resumed = run(tmp_path / "b", f"checkpoint.resume={tmp_path / 'b/run/checkpoints/step_000002'}")
    assert resumed == reference and len(reference) == 4
