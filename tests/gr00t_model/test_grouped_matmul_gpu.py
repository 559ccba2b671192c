"""GPU only: the per-embodiment grouped GEMMs (torch._grouped_mm's bf16 kernels, Hopper) against the release's
per-sample gather and bmm, at n1.6-3b's shapes, eagerly and captured in a CUDA graph."""

from __future__ import annotations

import pytest
import torch
from gr00t_model._grouped_matmul import grouped_supported, slot_matmul

pytestmark = pytest.mark.gpu


def _hopper() -> None:
    if torch.cuda.get_device_capability()[0] != 9:
        pytest.skip("torch._grouped_mm's bf16 kernels need Hopper (sm90)")


def _relative(got: torch.Tensor, want: torch.Tensor) -> float:
    return ((got.double() - want).norm() / want.norm()).item()


@pytest.mark.parametrize("tokens,fan_in,fan_out", [(50, 3072, 1536), (1, 128, 1024), (51, 1024, 128)])
def test_grouped_gemms_on_the_gpu_match_fp64_as_closely_as_the_gather(tokens, fan_in, fan_out) -> None:
    _hopper()
    gen = torch.Generator(device="cuda").manual_seed(0)
    weight = (0.02 * torch.randn(32, fan_in, fan_out, device="cuda", generator=gen)).to(torch.bfloat16)
    x = torch.randn(16, tokens, fan_in, device="cuda", generator=gen).to(torch.bfloat16)
    grad = torch.randn(16, tokens, fan_out, device="cuda", generator=gen).to(torch.bfloat16)
    slots = torch.tensor([5, 0, 5, 31, 2, 5, 0, 7, 7, 7, 5, 1, 30, 5, 5, 0], device="cuda")
    assert grouped_supported(x, weight)
    w64, x64 = weight.double()[slots], x.double()
    want_out = torch.bmm(x64, w64)
    want_dw = torch.zeros(32, fan_in, fan_out, device="cuda", dtype=torch.float64)
    want_dw.index_add_(0, slots, x64.transpose(1, 2) @ grad.double())
    results = {}
    for name in ("gather", "grouped"):
        w = weight.clone().requires_grad_(True)
        out = torch.bmm(x, w[slots]) if name == "gather" else slot_matmul(x, w, slots)
        out.backward(grad)
        results[name] = (out, w.grad)
    for name, (out, dw) in results.items():
        # bf16 products accumulated in fp32, the result rounded to bf16 once (2^-9 relative at most); the
        # gather also rounds each sample's weight gradient before summing them
        assert _relative(out, want_out) < 2**-8, name
        assert _relative(dw, want_dw) < 2**-8, name
    unused = [s for s in range(32) if s not in slots.tolist()]
    assert torch.equal(results["grouped"][1][unused], torch.zeros_like(results["grouped"][1][unused]))


def test_grouped_gemms_replay_in_a_cuda_graph_with_new_slots() -> None:
    _hopper()
    weight = (0.02 * torch.randn(32, 256, 512, device="cuda")).to(torch.bfloat16).requires_grad_(True)
    x = torch.randn(16, 50, 256, device="cuda", dtype=torch.bfloat16)
    slots = torch.zeros(16, dtype=torch.long, device="cuda")

    def step():
        weight.grad = None
        out = slot_matmul(x, weight, slots)
        out.float().sum().backward()
        return out.detach(), weight.grad

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        step()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out, dw = step()
    for new in ([3] * 16, list(range(16)), [9, 4] * 8):  # group sizes change on the device only
        slots.copy_(torch.tensor(new))
        graph.replay()
        torch.cuda.synchronize()
        torch.testing.assert_close(out, torch.bmm(x, weight.detach()[slots]), rtol=2**-7, atol=1e-3)
        assert set(dw.abs().sum(dim=(1, 2)).nonzero().flatten().tolist()) == set(new)
