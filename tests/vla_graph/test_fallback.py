"""GraphedStep's capture safety on CPU: steps the pre-capture check rejects, the eager fallback (only when
asked), and a capture that CUDA itself rejects, emulated."""

from __future__ import annotations

import logging

import pytest
import torch
from _graph_steps import GRAPH_MODES, linear_step, microbatches
from torch import nn
from vla_graph import GraphCaptureError, GraphConfig, GraphedStep


def _syncing_step(model: nn.Linear):
    def step(batch: dict) -> torch.Tensor:
        loss = model(batch["x"]).square().mean()
        if loss.item() > 1e9:  # a host sync that a graph cannot hold
            raise AssertionError("unreachable")
        loss.backward()
        return loss

    return step


@pytest.mark.parametrize("mode", GRAPH_MODES)
def test_unsafe_steps_raise_before_capture_by_default(mode: str) -> None:
    model = nn.Linear(3, 2)
    step = GraphedStep(_syncing_step(model), params=model.parameters(), config=GraphConfig(mode=mode))
    with pytest.raises(GraphCaptureError, match=r"\[host sync\] \.item\(\) at .*test_fallback\.py") as info:
        step(microbatches(1))
    assert info.value.findings and "fallback='eager'" in str(info.value)


@pytest.mark.parametrize("mode", GRAPH_MODES)
def test_eager_fallback_only_when_asked_and_then_matches_eager(mode: str, caplog) -> None:
    torch.manual_seed(0)
    model, ref_model = nn.Linear(3, 2), nn.Linear(3, 2)
    ref_model.load_state_dict(model.state_dict())
    step = GraphedStep(
        _syncing_step(model), params=model.parameters(), config=GraphConfig(mode=mode, fallback="eager")
    )
    ref = GraphedStep(
        _syncing_step(ref_model), params=ref_model.parameters(), config=GraphConfig(mode="eager")
    )
    with caplog.at_level(logging.WARNING, logger="vla_graph"):
        for seed in range(2):
            assert torch.equal(step(microbatches(1, seed))[0], ref(microbatches(1, seed))[0])
            assert torch.equal(model.weight.grad, ref_model.weight.grad)
    assert "fallback='eager'" in caplog.text and ".item()" in caplog.text
    assert step.report.captures == 0 and step.report.eager_iterations == 2 and len(step.report.fallbacks) == 1


def test_unchecked_steps_are_captured_as_is() -> None:
    model = nn.Linear(3, 2)
    step = GraphedStep(_syncing_step(model), params=model.parameters(), config=GraphConfig(check=False))
    step(microbatches(1))  # emulation cannot fail a capture; on a GPU CUDA would (see the gpu tests)
    assert step.report.captures == 1


class _FailingCapture:
    """Stands in for CUDA rejecting a capture (what a GPU does with a host sync the check missed)."""

    def __init__(self, backend, message: str) -> None:
        self.backend, self.message = backend, message

    def __getattr__(self, name: str):
        return getattr(self.backend, name)

    def capture(self, fn, generators):
        from vla_graph._device import CaptureFailed

        try:
            try:
                raise RuntimeError(self.message)
            except RuntimeError:
                raise RuntimeError(
                    "CUDA error: operation failed due to a previous error during capture"
                ) from None
        except RuntimeError as error:
            raise CaptureFailed(error, ["a warning raised while capturing"]) from error


@pytest.mark.parametrize("fallback", ["error", "eager"])
def test_a_rejected_capture_is_explained_and_falls_back_only_when_asked(fallback: str, caplog) -> None:
    model = nn.Linear(3, 2)
    step = GraphedStep(
        linear_step([], model, 1), params=model.parameters(), config=GraphConfig(fallback=fallback)
    )
    step._backend = _FailingCapture(step._backend, "CUDA error: capturing stream has unjoined work")
    if fallback == "error":
        with pytest.raises(GraphCaptureError, match="CUDA graph capture of microbatch 0 failed") as info:
            step(microbatches(1))
        assert "another CUDA stream" in str(info.value) and "a warning raised while capturing" in str(
            info.value
        )
        assert isinstance(info.value.__cause__, RuntimeError)
        return
    with caplog.at_level(logging.WARNING, logger="vla_graph"):
        out = step(microbatches(1))
    assert out[0].shape == () and step.report.eager_iterations == 1 and "unjoined" in step.report.fallbacks[0]
    assert model.weight.grad is not None and "restart it" in caplog.text
