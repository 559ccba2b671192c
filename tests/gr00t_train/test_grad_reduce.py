"""optimizations.grad_reduce_dtype reaches vla-overlap: gradients travel in bf16, accumulate in fp32."""

from __future__ import annotations

import pytest
import torch
from gr00t_train import ConfigError, Trainer


def test_bf16_gradient_reduction_is_wired(tmp_path, env, standins) -> None:
    cfg = standins.small_config(
        tmp_path, steps=2, optimizations__comm="overlap", optimizations__grad_reduce_dtype="bfloat16"
    )
    trainer = Trainer(cfg, standins.make_parts(), env)
    summary = trainer.fit()
    grads = trainer.comm.module._grads
    assert all(d.dtype == torch.float32 for d in grads.data)  # accumulation
    assert all(w is not None and w.dtype == torch.bfloat16 for w in grads.wire)  # the wire
    assert summary.steps == 2


def test_bf16_gradient_reduction_needs_our_comm_modes(tmp_path, standins) -> None:
    with pytest.raises(ConfigError, match="grad_reduce_dtype"):
        standins.small_config(
            tmp_path, optimizations__comm="ddp", optimizations__grad_reduce_dtype="bfloat16"
        )
