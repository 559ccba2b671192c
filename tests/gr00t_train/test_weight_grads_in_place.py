"""GR00T's weight gradients written into vla-overlap's buffers by their own GEMMs equal the copied ones.

The case the trainer routes (optimizations.weight_grads_in_place): bf16 weights under bf16 autocast, buffers
in the weights' dtype, one backward per step. The same GEMMs on the same layouts, so bitwise on a CPU; this
also shows no trainable Linear of the model is read twice in a step (a second read would be overwritten)."""

from __future__ import annotations

import copy

import torch
import vla_overlap
from gr00t_model import GR00TN16, GR00TConfig, make_dummy_batch
from torch import nn


def test_gr00t_weight_gradients_in_place_equal_the_copied_ones(env) -> None:
    config = GR00TConfig.preset(
        "tiny", frozen_dtype="bfloat16", trainable_dtype="bfloat16", compute_dtype="bfloat16"
    )
    torch.manual_seed(0)
    model = GR00TN16(config).train()
    batch = make_dummy_batch(config, 2, num_images=2)
    gen = torch.Generator().manual_seed(3)
    noise = torch.randn(2, config.action_horizon, config.max_action_dim, generator=gen)
    t = torch.rand(2, generator=gen) * 0.999
    grads, routed = [], []
    for in_place in (False, True):
        wrapped = vla_overlap.OverlapDataParallel(
            copy.deepcopy(model), vla_overlap.OverlapConfig(grad_reduce_dtype=None)
        )
        if in_place:
            routed.append(wrapped.write_weight_grads_in_place())
        wrapped.zero_grad_buffer()
        with torch.random.fork_rng():  # the same dropout draws in both runs
            torch.manual_seed(5)
            wrapped(batch, noise=noise, t=t)["loss"].backward()
        grads.append(
            {name: p.main_grad.clone() for name, p in wrapped.module.named_parameters() if p.requires_grad}
        )
    linears = [m for m in model.modules() if type(m) is nn.Linear and m.weight.requires_grad]
    assert routed == [len(linears)] and len(linears) > 20
    assert grads[0].keys() == grads[1].keys()
    for name in grads[0]:
        assert torch.equal(grads[0][name], grads[1][name]), name
