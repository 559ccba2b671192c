"""A finished trainer lets its model go: nothing (gradient hooks on the parameters, state-dict hooks, the
optimizer's side stream) keeps the model, its gradient buffers or optimizer state alive. The ablation ladder
trains several models in one process and measured each row's peak memory wrongly while this leaked."""

from __future__ import annotations

import gc
import weakref

import pytest
from gr00t_train import Trainer


@pytest.mark.parametrize("comm", ["overlap", "zero1_overlap"])
def test_the_model_is_freed_after_fit(tmp_path, env, standins, comm: str) -> None:
    cfg = standins.small_config(
        tmp_path, steps=2, optimizations__comm=comm, optimizations__optimizer_overlap="true",
        optimizations__graph="per_microbatch", checkpoint__save_final="false",
    )  # fmt: skip
    parts = standins.make_parts()
    trainer = Trainer(cfg, parts, env)
    trainer.fit()
    model, wrapper = weakref.ref(parts.model), weakref.ref(trainer.comm.module)
    del trainer, parts
    gc.collect()
    assert model() is None and wrapper() is None
