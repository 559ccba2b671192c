"""torch.compile'd code inside GraphedStep (on CPU: emulated graphs, the aot_eager backend, which traces
with dynamo and AOTAutograd but runs aten kernels; inductor's kernels are tested on the GPU). The check
traces compiled code as its eager code (torch.compiler.set_stance("force_eager")): it still finds what a
graph cannot hold, and it never makes dynamo recompile."""

from __future__ import annotations

import pytest
import torch
import torch._dynamo
from vla_graph import GraphCaptureError, GraphConfig, GraphedStep


@pytest.fixture(autouse=True)
def _fresh_dynamo():
    torch._dynamo.reset()
    torch._dynamo.utils.counters.clear()
    yield
    torch._dynamo.reset()  # compiled code of these tests must not leak into others


@pytest.mark.parametrize("mode", ["per_microbatch", "full_iteration"])
def test_compiled_blocks_in_graph_modes_equal_compiled_eager(toy, mode: str) -> None:
    eager = toy.train("eager", iterations=3, count=2, dropout=0.0, compile_backend="aot_eager")
    graphs_after_eager = torch._dynamo.utils.counters["stats"]["unique_graphs"]
    graphed = toy.train(mode, iterations=3, count=2, dropout=0.0, compile_backend="aot_eager")
    # The checked warmup ran the blocks' eager code and the capture reused what eager compiled: nothing new.
    assert torch._dynamo.utils.counters["stats"]["unique_graphs"] == graphs_after_eager > 0
    assert graphed["step"].report.captures == 1
    assert torch.equal(eager["losses"], graphed["losses"])
    for a, b in zip(eager["grads"], graphed["grads"]):
        assert all(torch.equal(x, y) for x, y in zip(a, b))
    plain = toy.train("eager", iterations=3, count=2, dropout=0.0)
    torch.testing.assert_close(plain["losses"], eager["losses"], rtol=1e-5, atol=1e-6)


def test_the_check_finds_a_host_sync_inside_compiled_code() -> None:
    layer = torch.nn.Linear(3, 3)

    def leaky(x: torch.Tensor) -> torch.Tensor:
        y = layer(x)
        return y * float(y.detach().sum())  # a host read: a graph would freeze this number

    compiled = torch.compile(leaky, backend="aot_eager")

    def step(batch: dict) -> torch.Tensor:
        loss = compiled(batch["x"]).square().mean()
        loss.backward()
        return loss

    graphed = GraphedStep(step, params=layer.named_parameters(), config=GraphConfig(mode="per_microbatch"))
    with pytest.raises(GraphCaptureError, match="host sync"):
        graphed([{"x": torch.randn(2, 3)}])
