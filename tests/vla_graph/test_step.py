"""GraphedStep on CPU, where graph modes run emulated: the same static buffers, warmup, checks, gradient
handling and callbacks as on a GPU, executed eagerly. Every mode is compared with eager, bitwise."""

from __future__ import annotations

import contextlib
import logging
import types

import pytest
import torch
import vla_graph
from _graph_steps import GRAPH_MODES, linear_step, microbatches
from torch import nn
from vla_graph import GraphConfig, GraphedStep, ShapeChangeError


def _same(a: dict, b: dict) -> bool:
    return torch.equal(a["losses"], b["losses"]) and all(
        torch.equal(x, y) for ga, gb in zip(a["grads"], b["grads"]) for x, y in zip(ga, gb)
    )


@pytest.mark.parametrize("mode", GRAPH_MODES)
@pytest.mark.parametrize("dropout", [0.0, 0.2])
def test_graph_modes_match_eager_bitwise(toy, mode: str, dropout: float) -> None:
    # With dropout on too: warmup's random numbers are undone, so all modes consume one stream.
    eager = toy.train("eager", iterations=3, count=2, dropout=dropout)
    graphed = toy.train(mode, iterations=3, count=2, dropout=dropout)
    assert _same(eager, graphed)
    assert graphed["step"].report.replays == 3 and graphed["step"].report.captures == 1


@pytest.mark.parametrize("mode", GRAPH_MODES)
def test_graph_modes_match_eager_with_adamw(toy, mode: str) -> None:
    eager = toy.train("eager", iterations=3, count=2, dropout=0.1, optimizer="adamw")
    assert _same(eager, toy.train(mode, iterations=3, count=2, dropout=0.1, optimizer="adamw"))


def test_cpu_runs_graph_modes_emulated_and_says_so(toy, caplog) -> None:
    with caplog.at_level(logging.WARNING, logger="vla_graph"):
        run = toy.train("per_microbatch", iterations=1, count=2, dropout=0.0)
    assert run["step"].report.backend == "emulated" and run["step"].report.graphs == 2
    assert "runs emulated" in caplog.text and "no speedup" in caplog.text
    assert toy.train("eager", iterations=1, count=2, dropout=0.0)["step"].report.backend == "eager"


def test_random_streams_are_consumed_identically_in_every_mode(toy) -> None:
    states = {}
    for mode in ["eager", *GRAPH_MODES]:
        run = toy.train(mode, iterations=2, count=3, dropout=0.3)
        draw_state = run["step"]._draw.generator.get_state()
        states[mode] = (draw_state, torch.get_rng_state())
    for mode in GRAPH_MODES:
        assert torch.equal(states[mode][0], states["eager"][0]), "draw generator"
        assert torch.equal(states[mode][1], states["eager"][1]), "default generator (dropout)"


class _RecordingSync:
    """A GradSync that records what GraphedStep asks of it, around a plain model's own .grad."""

    def __init__(self, events: list[str], model: nn.Module) -> None:
        self.events, self.model = events, model
        for p in model.parameters():
            p.grad = torch.zeros_like(p)  # backward accumulates in place, outside any graph's memory

    def zero(self) -> None:
        self.events.append("zero")
        for p in self.model.parameters():
            if p.grad is not None:
                p.grad.zero_()

    @contextlib.contextmanager
    def _tag(self, name: str):
        self.events.append(name)
        yield

    def no_sync(self):
        return self._tag("no_sync")

    def launch_in_backward(self):
        return self._tag("launch")

    def start(self) -> None:
        self.events.append("start")

    def finish(self) -> None:
        self.events.append("finish")

    def mark_synced(self) -> None:
        self.events.append("synced")


@pytest.mark.parametrize("sync_in_graph", [True, False])
@pytest.mark.parametrize("mode", ["eager", *GRAPH_MODES])
def test_grad_sync_is_driven_as_documented(mode: str, sync_in_graph: bool) -> None:
    events: list[str] = []
    model = nn.Linear(3, 2)
    step = GraphedStep(
        linear_step(events, model, 2),
        params=model.parameters(),
        config=GraphConfig(mode=mode, warmup_iters=2, sync_in_graph=sync_in_graph),
        grad_sync=_RecordingSync(events, model),
    )
    step(microbatches(2))
    captured = mode != "eager" and sync_in_graph
    last = "step1" if mode == "eager" else ("launch" if captured else "no_sync")
    for seed in range(1, 3):
        events.clear()
        step(microbatches(2, seed))
        # Emulation re-runs the captured Python at replay; a GPU replays the same kernels in this order.
        body = ["zero", "no_sync", "step0", last, *(["step1"] if last != "step1" else [])]
        assert events == [*body, "start", "finish", *(["synced"] if captured else [])]


def test_warmup_runs_the_sync_where_the_graph_will_hold_it() -> None:
    events: list[str] = []
    model = nn.Linear(3, 2)
    step = GraphedStep(
        linear_step(events, model, 2),
        params=model.parameters(),
        config=GraphConfig(mode="per_microbatch", warmup_iters=2),
        grad_sync=_RecordingSync(events, model),
    )
    step(microbatches(2))
    iteration = ["zero", "no_sync", "step0", "launch", "step1", "start", "finish"]
    # the check forces three warmup iterations (two traced, one as captured), then the captures
    assert events[: 3 * 7] == iteration * 3
    with pytest.raises(ValueError, match="sync_in_graph"):
        GraphConfig(sync_in_graph="yes")


def test_a_grad_sync_object_needs_every_method() -> None:
    model = nn.Linear(3, 2)
    with pytest.raises(TypeError, match="lacks mark_synced"):
        GraphedStep(lambda b: b, params=model.parameters(), grad_sync=types.SimpleNamespace(
            zero=int, no_sync=int, launch_in_backward=int, start=int, finish=int))  # fmt: skip


def test_gradients_accumulate_over_microbatches_into_owned_buffers() -> None:
    torch.manual_seed(0)
    model = nn.Linear(3, 2)
    step = GraphedStep(linear_step([], model, 2), params=model.parameters(), config=GraphConfig())
    owned = None
    for seed in range(3):
        batches = microbatches(2, seed)
        step(batches)
        if owned is None:
            owned = [p.grad for p in model.parameters()]
        assert all(p.grad is g for p, g in zip(model.parameters(), owned))
        reference = nn.Linear(3, 2)
        reference.load_state_dict(model.state_dict())
        for batch in batches:
            (reference(batch["x"]).square().mean() / 2).backward()
        for p, r in zip(model.parameters(), reference.parameters()):
            torch.testing.assert_close(p.grad, r.grad, rtol=0, atol=1e-7)
        torch.optim.SGD(model.parameters(), lr=0.1).step()
        model.zero_grad(set_to_none=True)  # vla_graph re-attaches its buffers on the next call


def test_a_replaced_grad_is_an_error() -> None:
    model = nn.Linear(3, 2)
    step = GraphedStep(linear_step([], model, 1), params=model.named_parameters(), config=GraphConfig())
    step(microbatches(1))
    model.weight.grad = torch.zeros_like(model.weight)
    with pytest.raises(RuntimeError, match=r"weight\.grad was replaced by a new tensor"):
        step(microbatches(1))


def test_a_hook_that_removes_grads_needs_a_sync_object() -> None:
    model = nn.Linear(3, 2)
    for p in model.parameters():
        p.register_post_accumulate_grad_hook(lambda p: setattr(p, "grad", None))
    step = GraphedStep(linear_step([], model, 1), params=model.named_parameters(), config=GraphConfig())
    with pytest.raises(RuntimeError, match="grad_sync"):
        step(microbatches(1))


class _BufferSync(_RecordingSync):
    """A bucketing wrapper's pattern: hooks add .grad into its own buffers and drop .grad."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__([], model)
        model.zero_grad(set_to_none=True)  # .grad stays None: the hooks move every gradient out
        self.main = {p: torch.zeros_like(p) for p in model.parameters()}

        def move(p: torch.Tensor) -> None:
            self.main[p].add_(p.grad)
            p.grad = None

        for p in model.parameters():
            p.register_post_accumulate_grad_hook(move)

    def zero(self) -> None:
        for g in self.main.values():
            g.zero_()


@pytest.mark.parametrize("mode", ["eager", *GRAPH_MODES])
def test_gradient_buffers_of_a_sync_object_filled_by_hooks(mode: str) -> None:
    torch.manual_seed(0)
    model = nn.Linear(3, 2)
    sync = _BufferSync(model)
    step = GraphedStep(
        linear_step([], model, 2), params=model.parameters(), config=GraphConfig(mode=mode), grad_sync=sync
    )
    reference = nn.Linear(3, 2)
    reference.load_state_dict(model.state_dict())
    for seed in range(2):
        batches = microbatches(2, seed)
        step(batches)
        reference.zero_grad()
        for batch in batches:
            (reference(batch["x"]).square().mean() / 2).backward()
        for p, r in zip(model.parameters(), reference.parameters()):
            assert p.grad is None
            torch.testing.assert_close(sync.main[p], r.grad, rtol=0, atol=1e-7)


def test_a_grad_allocated_inside_the_capture_is_an_error() -> None:
    """A sync object whose zero() drops .grad while nothing moves gradients: autograd would hand the graph's
    own memory out as .grad."""
    model = nn.Linear(3, 2)

    class DropGrads(_RecordingSync):
        def zero(self) -> None:
            model.zero_grad(set_to_none=True)

    step = GraphedStep(
        linear_step([], model, 1),
        params=model.named_parameters(),
        config=GraphConfig(),
        grad_sync=DropGrads([], model),
    )
    with pytest.raises(RuntimeError, match=r"\.grad was set to new memory during capture"):
        step(microbatches(1))


def test_call_counts_warmup_capture_and_replay() -> None:
    events: list[str] = []
    model = nn.Linear(3, 2)
    step = GraphedStep(
        linear_step(events, model, 2), params=model.parameters(), config=GraphConfig(warmup_iters=3)
    )
    step(microbatches(2))
    assert len(events) == 2 * 3 + 2 + 2  # warmup, emulated capture, first replay
    step(microbatches(2))
    assert len(events) == 12
    assert step.report.replays == 2 and step.report.capture_seconds > 0


def test_outputs_are_copies_that_later_calls_do_not_overwrite() -> None:
    model = nn.Linear(3, 2)
    step = GraphedStep(linear_step([], model, 1), params=model.parameters())
    first = step(microbatches(1, seed=0))[0]
    kept = first.clone()
    step(microbatches(1, seed=1))
    assert torch.equal(first, kept) and not first.requires_grad


def test_shape_changes_raise_naming_the_key() -> None:
    model = nn.Linear(3, 2)
    step = GraphedStep(linear_step([], model, 1), params=model.parameters())
    step(microbatches(1))
    wider = [{"x": torch.randn(5, 3), "index": 0}]
    with pytest.raises(ShapeChangeError, match=r"microbatch 0\['x'\] has shape \(5, 3\) instead of \(4, 3\)"):
        step(wider)
    with pytest.raises(
        ShapeChangeError, match="the iteration has 2 microbatches; the graphs were captured for 1"
    ):
        step(microbatches(2))
    halves = [{"x": torch.randn(4, 3).double(), "index": 0}]
    with pytest.raises(ShapeChangeError, match="dtype torch.float64 instead of torch.float32"):
        step(halves)


@pytest.mark.parametrize("mode", GRAPH_MODES)
def test_recapture_keeps_one_graph_set_per_shape(mode: str) -> None:
    torch.manual_seed(0)
    model = nn.Linear(3, 2)
    ref_model = nn.Linear(3, 2)
    ref_model.load_state_dict(model.state_dict())
    config = GraphConfig(mode=mode, on_shape_change="recapture", max_captures=2)
    step = GraphedStep(linear_step([], model, 1), params=model.parameters(), config=config)
    ref = GraphedStep(
        linear_step([], ref_model, 1), params=ref_model.parameters(), config=GraphConfig(mode="eager")
    )
    for rows in [4, 6, 4, 6]:
        batch = [{"x": torch.randn(rows, 3), "index": 0}]
        assert torch.equal(step(batch)[0], ref(batch)[0])
        assert torch.equal(model.weight.grad, ref_model.weight.grad)
    assert step.report.captures == 2 and step.report.replays == 4
    with pytest.raises(ShapeChangeError, match="max_captures=2 is reached"):
        step([{"x": torch.randn(5, 3), "index": 0}])


def test_python_values_in_batches_are_part_of_the_shape() -> None:
    model = nn.Linear(3, 2)
    step = GraphedStep(lambda b: model(b["x"]).sum() * b["scale"], params=model.parameters())
    step([{"x": torch.randn(4, 3), "scale": 2.0}])
    with pytest.raises(ShapeChangeError, match=r"microbatch 0\['scale'\] is the Python float 3.0"):
        step([{"x": torch.randn(4, 3), "scale": 3.0}])


def test_registered_generators_inside_the_step_match_eager() -> None:
    results = {}
    for mode in ["eager", *GRAPH_MODES]:
        gen = torch.Generator().manual_seed(3)
        model = nn.Linear(3, 2)
        torch.nn.init.constant_(model.weight, 0.5)
        torch.nn.init.constant_(model.bias, 0.1)

        def step(batch: dict, model=model, gen=gen) -> torch.Tensor:
            noise = torch.randn(batch["x"].shape, generator=gen)
            loss = model(batch["x"] + noise).square().mean()
            loss.backward()
            return loss

        graphed = GraphedStep(
            step, params=model.parameters(), config=GraphConfig(mode=mode), generators=[gen]
        )
        results[mode] = torch.stack([graphed(microbatches(2, seed))[1] for seed in range(3)])
    assert torch.equal(results["per_microbatch"], results["eager"])
    assert torch.equal(results["full_iteration"], results["eager"])


def test_moved_parameters_are_detected_and_reset_recaptures() -> None:
    model = nn.Linear(3, 2)
    step = GraphedStep(linear_step([], model, 1), params=model.named_parameters())
    step(microbatches(1))
    model.weight.data = model.weight.data.clone()
    with pytest.raises(RuntimeError, match="weight moved to new memory since the graph was captured"):
        step(microbatches(1))
    step.reset()
    step(microbatches(1))
    assert step.report.captures == 2


def test_bad_calls_and_outputs_are_explained() -> None:
    model = nn.Linear(3, 2)
    step = GraphedStep(lambda b: {"loss": model(b["x"]).sum(), "n": 3}, params=model.parameters())
    with pytest.raises(TypeError, match="non-empty list of dicts"):
        step({"x": torch.randn(4, 3)})
    with pytest.raises(TypeError, match="microbatch 1 is a Tensor"):
        step([{"x": torch.randn(4, 3)}, torch.ones(1)])
    with pytest.raises(TypeError, match=r"step output\['n'\] is a int"):
        step([{"x": torch.randn(4, 3)}])
    clash = GraphedStep(
        lambda b: b["x"].sum(), params=model.parameters(), draw=lambda b: {"x": torch.ones(1)}
    )
    with pytest.raises(ValueError, match=r"draw\(\) returned \['x'\], which microbatch 0 already has"):
        clash([{"x": torch.randn(4, 3)}])
    with pytest.raises(ValueError, match="params is empty"):
        GraphedStep(lambda b: b, params=[])


def test_capture_stream_is_a_no_op_off_gpu() -> None:
    with vla_graph.capture_stream("cpu"):
        assert torch.ones(1).item() == 1.0
