"""Activation checkpointing on CUDA with compiled blocks (compile_blocks, Inductor): under either policy the
checkpoint is compiled with each recomputed block, trains the same numbers as keeping everything, keeps less
than it, and runs inside a captured CUDA graph."""

from __future__ import annotations

import pytest
import torch
from gr00t_model import GR00TN16, GR00TConfig, make_dummy_batch

pytestmark = pytest.mark.gpu
CUDA = torch.device("cuda")


def _model(blocks: tuple[str, ...], policy: str) -> GR00TN16:
    torch.manual_seed(0)
    # fp32 and no dropout: no random draw inside the step, so a captured graph replays the same step
    config = GR00TConfig.preset("tiny", checkpoint_blocks=blocks, checkpoint_policy=policy, dit_dropout=0.0)
    return GR00TN16(config).train().to(CUDA)


def _inputs(model: GR00TN16, batch_size: int = 8):
    batch = make_dummy_batch(model.config, batch_size=batch_size, seed=1, device=CUDA)
    gen = torch.Generator(device=CUDA).manual_seed(3)
    config = model.config
    noise = torch.randn(batch_size, config.action_horizon, config.max_action_dim, generator=gen, device=CUDA)
    t = torch.rand(batch_size, generator=gen, device=CUDA) * 0.999
    return batch, noise, t


def _step(model: GR00TN16, batch, noise, t) -> tuple[torch.Tensor, int]:
    """Loss and the bytes the forward left allocated for the backward; the backward fills .grad."""
    for p in model.parameters():
        p.grad = None
    torch.cuda.synchronize()
    before = torch.cuda.memory_allocated()
    loss = model(batch, noise=noise, t=t)["loss"]
    kept = torch.cuda.memory_allocated() - before
    loss.backward()
    return loss.detach(), kept


def _grads(model: GR00TN16) -> dict[str, torch.Tensor]:
    return {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


def _compiled_run(blocks: tuple[str, ...], policy: str):
    model = _model(blocks, policy)
    torch._dynamo.reset()
    model.compile_blocks()
    try:
        inputs = _inputs(model)
        _step(model, *inputs)  # compiles
        loss, kept = _step(model, *inputs)
        return model, inputs, loss, kept, _grads(model)
    finally:
        torch._dynamo.reset()


def _scale(name: str, grads: dict[str, torch.Tensor], largest: float) -> float:
    """The size of the terms a gradient sums, which bounds how far summing them in another order moves it.
    A key projection's bias has a zero gradient in exact arithmetic (softmax ignores a shift shared by every
    key of a query): rounding noise, bounded by the other gradients. Query and key projections sum terms of
    the value projection's size that cancel where the softmax is near uniform (small logits at init: their
    sum can be 1e-5 of its terms), so they are held to the value projection's scale."""
    own = grads[name].abs().max().item()
    if name.endswith(("to_k.bias", "k_proj.bias")):
        return largest
    for qk, v in (("to_q.", "to_v."), ("to_k.", "to_v."), ("q_proj.", "v_proj."), ("k_proj.", "v_proj.")):
        value = name.replace(qk, v)
        if qk in name and value in grads:
            return max(own, grads[value].abs().max().item())
    return own


@pytest.mark.parametrize("policy", ["selective", "full"])
def test_compiled_recompute_trains_the_same_numbers(policy) -> None:
    """Against the compiled blocks without recompute: Inductor fuses the recomputed graphs differently, so fp32
    sums come in another order (relative 1e-5 of a gradient's scale); the forward keeps less."""
    *_, loss, kept, grads = _compiled_run((), "full")
    model, _, again, rekept, regrads = _compiled_run(("dit", "llm"), policy)
    recomputed = model.recomputed_blocks()
    assert recomputed and all(getattr(b, "checkpoints_itself", False) for b in recomputed)
    torch.testing.assert_close(again, loss, rtol=1e-5, atol=1e-6)
    assert grads.keys() == regrads.keys()
    largest = max(grad.abs().max().item() for grad in grads.values())
    for name, grad in grads.items():
        torch.testing.assert_close(
            regrads[name],
            grad,
            rtol=1e-4,
            atol=1e-5 * _scale(name, grads, largest),
            msg=lambda detail, name=name: f"{name}: {detail}",
        )
    assert rekept < kept, (policy, rekept, kept)
    model.uncompile_blocks()


@pytest.mark.parametrize("policy", ["selective", "full"])
def test_compiled_recompute_replays_in_a_cuda_graph(policy) -> None:
    """The compiled recomputing step (forward and backward) captured in a CUDA graph: a replay gives the loss
    and gradients of the step run without the graph, bit for bit (the same kernels on the same inputs). The
    recomputation reads no generator state, which a capture forbids."""
    model, inputs, loss, _, grads = _compiled_run(("dit", "llm"), policy)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):
            _step(model, *inputs)
    torch.cuda.current_stream().wait_stream(side)
    for p in model.parameters():
        p.grad = None
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured = model(inputs[0], noise=inputs[1], t=inputs[2])["loss"]
        captured.backward()
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(captured, loss)
    for name, grad in grads.items():
        assert torch.equal(dict(model.named_parameters())[name].grad, grad), name
    model.uncompile_blocks()
