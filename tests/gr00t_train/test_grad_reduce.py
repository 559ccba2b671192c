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


@pytest.mark.parametrize(
    ("sets", "world_size", "expected"),
    [
        ({}, 1, None),  # nothing accumulates: the flat step reads the bf16 gradients in place
        ({"optim__grad_accum": 2}, 1, torch.float32),  # microbatches accumulate in fp32
        ({}, 2, torch.float32),  # ranks reduce in fp32
        ({"optimizations__flat_optimizer": "off"}, 1, torch.float32),  # torch's AdamW steps fp32 gradients
        ({"optimizations__bf16_weights": False}, 1, torch.float32),  # fp32 weights: fp32 gradients anyway
    ],
)
def test_gradient_buffers_keep_bf16_only_where_nothing_accumulates(
    tmp_path, standins, sets, world_size, expected
) -> None:
    """The gradient buffers' dtype the comm plan gives vla-overlap: bf16 weights' own dtype only with the flat
    step, one microbatch and one rank (decided without touching a GPU: the device is only named)."""
    from gr00t_train._comm import _grad_buffer_dtype
    from gr00t_train._distributed import DistEnv

    base = {"optimizations__comm": "zero1_overlap", "optimizations__bf16_weights": True}
    cfg = standins.small_config(tmp_path, **{**base, **sets})
    env = DistEnv(rank=0, world_size=world_size, local_rank=0, device=torch.device("cuda"))
    assert _grad_buffer_dtype(cfg, env) == expected
