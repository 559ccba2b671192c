"""Helpers of the memory planner's tests (test_memory_plan.py, test_memory_selective.py): the demo config on a
CPU, the tiny model with a training loss at any batch size, and the planner on n1.6-3b's meta model."""

from __future__ import annotations

from types import SimpleNamespace

import gr00t_model
import gr00t_train
import torch
from gr00t_model import GR00TN16, GR00TConfig
from gr00t_train.config.optimizations import resolve_optimizations
from gr00t_train.memory import budget
from gr00t_train.memory.plan import GiB, predict

CPU = torch.device("cpu")


def memory_cfg(tmp_path, *overrides, device=CPU):
    base = gr00t_train.load_config(
        preset="demo",
        overrides=[
            "device=cpu", f"output_dir={tmp_path / 'run'}", "logging.progress=false", "logging.plots=false",
            "data.batch_size=2", "checkpoint.save_final=false",
        ],
    )  # fmt: skip
    cfg = gr00t_train.apply_overrides(base, list(overrides))
    return resolve_optimizations(cfg, device)[0]


def tiny_model(**fields):
    torch.manual_seed(0)
    config = GR00TConfig.preset("tiny", llm_intermediate_size=192, **fields)
    model = GR00TN16(config).train()

    def loss_at(batch: int) -> torch.Tensor:
        inputs = gr00t_model.make_dummy_batch(config, batch, num_images=2, seed=0)
        noise = torch.randn(batch, config.action_horizon, config.max_action_dim)
        t = model.action_head.sample_time(batch, CPU)
        return model(inputs, noise=noise, t=t)["loss"]

    return model, loss_at


def planned(tmp_path, budget_gib, *overrides, world_size=1):
    cfg = memory_cfg(tmp_path, "model.preset=n1.6-3b", "data.batch_size=16", *overrides)
    if budget_gib is not None:
        cfg = gr00t_train.apply_overrides(cfg, [f"memory.budget_gib={budget_gib}"])
    env = SimpleNamespace(device=CPU, world_size=world_size, is_main=True)
    return budget.plan_for_budget(cfg, env)


def predicted_gib(tmp_path, *overrides) -> float:
    cfg = memory_cfg(tmp_path, "model.preset=n1.6-3b", "data.batch_size=16", *overrides)
    model, shapes = budget.meta_model(cfg, CPU)
    moments = budget.resolved_moments(cfg)
    return predict(model, cfg, world_size=1, device_type="cpu", shapes=shapes, moments=moments).total / GiB
