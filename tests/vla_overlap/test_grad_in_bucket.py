"""Linear layers whose weight-gradient GEMM writes into the gradient buffer (`_grad_in_bucket`) against the
plain path: autograd's gradient copied in. fp32 on a CPU: the same GEMM on the same layouts, so bitwise
where the GEMM writes; where it adds (accumulation) within the rounding of one fp32 add per element."""

from __future__ import annotations

import pytest
import torch
from torch import nn
from vla_overlap._grad_in_bucket import route_linears, route_weight_grad, unroute_weight_grad


class _Block(nn.Module):
    def __init__(self, d: int = 24) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(d)
        self.up = nn.Linear(d, 4 * d)
        self.down = nn.Linear(4 * d, d, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.down(torch.nn.functional.gelu(self.up(self.norm(x))))


def _grads(block: nn.Module, x: torch.Tensor, fn=None) -> dict[str, torch.Tensor]:
    block.zero_grad(set_to_none=True)
    (block if fn is None else fn)(x).square().sum().backward()
    return {name: p.grad for name, p in block.named_parameters()}


@pytest.mark.parametrize("compiled", [False, True], ids=["eager", "compiled"])
def test_the_gemm_writes_the_weight_gradient_into_its_buffer(compiled: bool) -> None:
    torch.manual_seed(0)
    block, x = _Block(), torch.randn(3, 40, 24)
    # the plain path run the same way: compiled, Inductor's own kernels compute the gradient reaching the GEMM
    reference = _grads(block, x, torch.compile(block, dynamic=False) if compiled else None)
    torch._dynamo.reset()
    buffers = {id(p): torch.full_like(p, float("nan")) for p in (block.up.weight, block.down.weight)}
    assert {id(m.weight) for m in route_linears(block, buffers, accumulate=False)} == set(buffers)
    fired = []
    handles = [p.register_post_accumulate_grad_hook(lambda p: fired.append(p)) for p in block.parameters()]
    try:
        fn = torch.compile(block, dynamic=False) if compiled else None
        got = _grads(block, x, fn)
        for linear, name in ((block.up, "up.weight"), (block.down, "down.weight")):
            assert torch.equal(buffers[id(linear.weight)], reference[name]), name
            assert got[name].shape == linear.weight.shape  # the placeholder AccumulateGrad took
        for name in ("up.bias", "norm.weight", "norm.bias"):
            torch.testing.assert_close(got[name], reference[name], rtol=1e-6, atol=1e-6)
        assert len(fired) == len(list(block.parameters()))  # every hook fired, the routed ones too
    finally:
        for handle in handles:
            handle.remove()
        for linear in (block.up, block.down):
            unroute_weight_grad(linear)
        torch._dynamo.reset()


def test_accumulating_adds_into_the_buffer() -> None:
    torch.manual_seed(1)
    linear, xs = nn.Linear(16, 8), [torch.randn(64, 16) for _ in range(3)]
    start = torch.randn(8, 16)
    expected = start.clone()
    for x in xs:
        expected += _grads(linear, x)["weight"]
    buffer = start.clone()
    route_weight_grad(linear, buffer, accumulate=True)
    for x in xs:
        _grads(linear, x)
    # addmm adds inside the GEMM, the reference after it: one fp32 rounding apart per step
    torch.testing.assert_close(buffer, expected, rtol=4 * torch.finfo(torch.float32).eps, atol=1e-6)


def test_tied_and_mismatched_weights_are_left_alone() -> None:
    shared = nn.Linear(8, 8)
    tied = nn.Linear(8, 8)
    tied.weight = shared.weight
    model = nn.Sequential(shared, tied, nn.Linear(8, 8), nn.Linear(8, 8))
    targets = {id(m.weight): torch.zeros_like(m.weight) for m in model}
    targets[id(model[3].weight)] = torch.zeros_like(model[3].weight, dtype=torch.float64)
    assert route_linears(model, targets, accumulate=False) == [model[2]]


def test_a_weight_cast_by_autocast_is_refused() -> None:
    linear = nn.Linear(8, 8)
    route_weight_grad(linear, torch.zeros_like(linear.weight), accumulate=False)
    with (
        torch.autocast("cpu", dtype=torch.bfloat16),
        pytest.raises(RuntimeError, match="cast to torch.bfloat16"),
    ):
        linear(torch.randn(2, 8))
    with torch.no_grad():  # no backward, no bucket: the plain layer
        assert linear(torch.randn(2, 8)).shape == (2, 8)


@pytest.mark.parametrize("world_size", [1, 2])
def test_the_wrapper_reduces_what_the_copies_gave(pool, world_size: int) -> None:
    for result in pool.run("in_place_equals_copies", world_size):
        assert result["routed"] == 8  # embed, 3 blocks x (fc1, fc2), head; not the frozen layer
        for plain, in_place in zip(result["plain"], result["in_place"]):
            assert torch.equal(plain, in_place)


def test_accumulating_microbatches_add_into_zeroed_buffers(pool) -> None:
    for result in pool.run("in_place_equals_copies", 2, micro=3):
        for plain, in_place in zip(result["plain"], result["in_place"]):
            # the GEMM adds in its epilogue, the plain path after it: one fp32 rounding apart per microbatch
            torch.testing.assert_close(in_place, plain, rtol=8 * torch.finfo(torch.float32).eps, atol=1e-7)


def test_a_second_backward_in_a_writing_step_raises(pool) -> None:
    (result,) = pool.run("in_place_second_backward_raises", 1)
    assert result["raised"] is not None and "second gradient" in result["raised"]


def test_a_module_that_outlives_its_wrapper_trains_plainly(pool) -> None:
    (result,) = pool.run("in_place_outlived_by_the_module", 1)
    assert result == {"routed": 8, "plain": True, "equal": True}


def test_a_rewrapped_module_keeps_the_new_wrappers_routes(pool) -> None:
    (result,) = pool.run("in_place_rewrapped", 1)
    assert result == {"routed": 8, "equal": True}
