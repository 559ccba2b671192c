"""GraphedStep: run a training iteration (a list of microbatches) eagerly, as one graph, or as one graph per
microbatch, with the same results and the same consumption of random numbers in every mode."""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from typing import Any

import torch

from ._check import Checker, Finding, eager_stance
from ._config import GraphConfig
from ._device import CaptureFailed, backend_for
from ._errors import GraphCaptureError, ShapeChangeError
from ._explain import explain_capture_failure
from ._grads import ParamSet
from ._random import restore_rng, snapshot_rng, unique_generators
from ._static import StaticInputs
from ._sync import GradSync, check_grad_sync
from ._tree import clone, describe_difference, detach, flatten, map_tree, signature

logger = logging.getLogger("vla_graph")

StepFn = Callable[[dict[str, Any]], Any]
DrawFn = Callable[[Mapping[str, Any]], Mapping[str, torch.Tensor]]


@dataclass
class GraphReport:
    """What a GraphedStep actually did: read it to know whether graphs ran."""

    mode: str
    """The requested GraphConfig.mode."""
    backend: str
    """"cuda_graph" (real graphs), "emulated" (graph modes run eagerly off-GPU) or "eager"."""
    captures: int = 0
    """Graph sets captured (one per distinct batch signature)."""
    graphs: int = 0
    """CUDA graphs held (per_microbatch: one per microbatch position and signature)."""
    capture_seconds: float = 0.0
    """Time spent in warmup, checks and capture."""
    replays: int = 0
    """Iterations run by replaying graphs."""
    eager_iterations: int = 0
    """Iterations run eagerly (eager mode or a fallback)."""
    fallbacks: list[str] = field(default_factory=list)
    """Why a batch signature fell back to eager (GraphConfig.fallback='eager')."""


@dataclass
class _Captured:
    """The graphs of one batch signature, with their static inputs and outputs."""

    inputs: list[StaticInputs]
    graphs: list[Any] = field(default_factory=list)
    outputs: list[Any] = field(default_factory=list)
    eager: bool = False


class GraphedStep:
    """Run a user's microbatch step (forward + loss + backward) over an iteration, eagerly or graphed.

    `step_fn(batch)` receives one microbatch (a dict; random draws merged in), calls backward itself and
    returns its outputs (a tensor or a dict/list of tensors, e.g. the loss). Calling the GraphedStep with
    the iteration's microbatches zeroes the gradients, runs every microbatch, synchronizes the gradients
    and returns each microbatch's outputs, detached and never aliasing graph memory. The optimizer step
    stays with the caller, after the call.

    Gradients: with `grad_sync=None` vla_graph gives every trainable parameter a `.grad` buffer of its own
    (outside the graph pool) and zeroes it before each iteration. With a `grad_sync` object (the `GradSync`
    protocol, e.g. vla_overlap's `OverlapDataParallel.grad_sync`) the object owns the buffers, and the
    GraphedStep drives it (module docstring of `_sync`, README table): zero(); no_sync() around every
    microbatch but the last; the last one plain (eager: its hooks may overlap the reduction) or under
    launch_in_backward() when the sync is captured with it; start(), finish(); mark_synced() after a replay
    whose graph ran them."""

    def __init__(
        self,
        step_fn: StepFn,
        *,
        params: Iterable[Any],
        config: GraphConfig | None = None,
        draw: DrawFn | None = None,
        generators: Sequence[torch.Generator] = (),
        grad_sync: GradSync | None = None,
    ) -> None:
        self.config = config if config is not None else GraphConfig()
        if not callable(step_fn):
            raise TypeError(f"step_fn must be callable, got {type(step_fn).__name__}")
        if grad_sync is not None:
            check_grad_sync(grad_sync)
        self._step_fn = step_fn
        self._draw = draw
        self._generators = unique_generators(generators)
        self._grad_sync = grad_sync
        self._params = ParamSet(params, grad_sync)
        self.device = self._params.device
        graphed = self.config.mode != "eager"
        self._backend = backend_for(self.device, self.config.capture_error_mode) if graphed else None
        self._captured: dict[tuple, _Captured] = {}
        self.report = GraphReport(self.config.mode, self._backend.name if self._backend else "eager")
        if self.report.backend == "emulated":
            logger.warning(
                "vla_graph: parameters are on %s, where CUDA graphs do not exist; mode %r runs emulated "
                "(same static buffers, warmup, checks and callbacks, executed eagerly; no speedup)",
                self.device,
                self.config.mode,
            )

    # ----------------------------------------------------------------------------------------- calling
    def __call__(self, microbatches: Sequence[Mapping[str, Any]]) -> list[Any]:
        """Run one iteration; returns the outputs of each microbatch."""
        inputs = self._with_draws(microbatches)
        self._params.prepare()
        if self._backend is None:
            return self._run_eagerly(inputs)
        key = tuple(signature(x, f"microbatch {i}") for i, x in enumerate(inputs))
        captured = self._captured.get(key)
        if captured is None:
            captured = self._capture(key, inputs)
        if captured.eager:
            return self._run_eagerly(inputs)
        self._params.check_addresses()
        return self._replay(captured, inputs)

    def reset(self) -> None:
        """Drop every captured graph (after moving or replacing parameters); the next call captures again."""
        self._captured.clear()
        self._params.forget_addresses()
        self.report.graphs = 0

    def _with_draws(self, microbatches: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
        if isinstance(microbatches, Mapping) or not isinstance(microbatches, Sequence) or not microbatches:
            raise TypeError("pass the iteration's microbatches as a non-empty list of dicts")
        for index, batch in enumerate(microbatches):
            if not isinstance(batch, Mapping):
                raise TypeError(f"microbatch {index} is a {type(batch).__name__}, not a dict of tensors")
        if self._draw is None:
            return [dict(batch) for batch in microbatches]
        # Every mode draws for all microbatches first, in order: the random stream is consumed identically.
        drawn = [self._draw(batch) for batch in microbatches]
        merged = []
        for index, (batch, draws) in enumerate(zip(microbatches, drawn)):
            clash = sorted(set(batch) & set(draws))
            if clash:
                raise ValueError(f"draw() returned {clash}, which microbatch {index} already has")
            merged.append({**batch, **draws})
        return merged

    def _run_step(self, batch: dict[str, Any], context: AbstractContextManager | None = None) -> Any:
        with context if context is not None else contextlib.nullcontext():
            out = self._step_fn(batch)
        for path, leaf in flatten(out, "step output"):
            if leaf is not None and not isinstance(leaf, torch.Tensor):
                raise TypeError(
                    f"{path} is a {type(leaf).__name__}; a step returns tensors only (a graph would freeze "
                    "Python values at capture)"
                )
        return detach(out)

    @property
    def _sync_captured(self) -> bool:
        """Whether the graphs hold the gradient sync (else it runs eagerly after the replay)."""
        return self._grad_sync is not None and self.config.mode != "eager" and self.config.sync_in_graph

    def _context(self, index: int, count: int) -> AbstractContextManager | None:
        """What the backward of microbatch `index` of `count` runs under (see the class docstring)."""
        sync = self._grad_sync
        if sync is None:
            return None
        if index < count - 1:
            return sync.no_sync()
        if self._backend is None:
            return None  # eager: the object's own hooks may reduce while this backward runs
        # Hooks never run at replay: either they launch at capture, inside the graph with the wait, or
        # the last backward only accumulates and the sync runs eagerly after the replay.
        return sync.launch_in_backward() if self._sync_captured else sync.no_sync()

    def _sync(self) -> None:
        if self._grad_sync is not None:
            self._grad_sync.start()
            self._grad_sync.finish()

    def _step_then_sync(self, batch: dict[str, Any], context: AbstractContextManager | None) -> Any:
        """The last microbatch of per_microbatch with the sync captured: its step and the sync, one graph."""
        out = self._run_step(batch, context)
        self._sync()
        return out

    def _iteration(
        self, batches: list[Any], *, sync: bool, checker: Checker | None = None, tag: Any = 0
    ) -> list:
        outputs = []
        for index, batch in enumerate(batches):
            with checker.watching((tag, index)) if checker else contextlib.nullcontext():
                outputs.append(self._run_step(batch, self._context(index, len(batches))))
        if sync:
            with checker.watching((tag, "sync")) if checker else contextlib.nullcontext():
                self._sync()
        return outputs

    def _run_eagerly(self, inputs: list[dict[str, Any]]) -> list[Any]:
        device = self.device
        move = lambda v: v.to(device, non_blocking=True) if isinstance(v, torch.Tensor) else v  # noqa: E731
        on_device = [map_tree(move, x) for x in inputs]
        self._params.zero()
        outputs = self._iteration(on_device, sync=True)
        self.report.eager_iterations += 1
        return outputs

    def _replay(self, captured: _Captured, inputs: list[dict[str, Any]]) -> list[Any]:
        for static, batch in zip(captured.inputs, inputs):
            static.fill(batch)
        self._params.zero()
        backend = self._backend
        if self.config.mode == "full_iteration":
            backend.replay(captured.graphs[0])
            outputs = clone(captured.outputs[0])
        else:
            outputs = []
            for graph, static_out in zip(captured.graphs, captured.outputs):
                backend.replay(graph)
                outputs.append(clone(static_out))
        if not self._sync_captured:
            self._sync()  # autograd hooks do not fire during replay: the sync is driven from here
        elif self._grad_sync is not None:
            self._grad_sync.mark_synced()
        self.report.replays += 1
        return outputs

    # ----------------------------------------------------------------------------------------- capture
    def _capture(self, key: tuple, inputs: list[dict[str, Any]]) -> _Captured:
        config = self.config
        if self._captured:
            if config.on_shape_change == "error":
                expected = next(iter(self._captured))
                raise ShapeChangeError(_shape_message(expected, key))
            if len(self._captured) >= config.max_captures:
                raise ShapeChangeError(
                    f"this iteration's batches match none of the {len(self._captured)} captured shape "
                    f"variants and GraphConfig.max_captures={config.max_captures} is reached. Pad batches "
                    "to a few fixed sizes (vla_graph.bucket_size) or raise max_captures. Difference from "
                    "the first variant: " + "; ".join(_difference_lines(next(iter(self._captured)), key))
                )
        started = time.perf_counter()
        captured = _Captured(
            [StaticInputs(x, self.device, name=f"microbatch {i}") for i, x in enumerate(inputs)]
        )
        try:
            self._warmup_and_capture(captured, inputs)
        except _GiveUp as give_up:
            if config.fallback == "error":
                raise GraphCaptureError(give_up.message, give_up.findings) from give_up.cause
            logger.warning(
                "vla_graph: running this batch signature eagerly (fallback='eager'):\n%s", give_up.message
            )
            self.report.fallbacks.append(give_up.message)
            captured = _Captured([], eager=True)
        else:
            self._params.remember_addresses()
            self.report.captures += 1
            self.report.graphs += len(captured.graphs)
        self.report.capture_seconds += time.perf_counter() - started
        self._captured[key] = captured
        return captured

    def _warmup_and_capture(self, captured: _Captured, inputs: list[dict[str, Any]]) -> None:
        backend, config = self._backend, self.config
        full = config.mode == "full_iteration"
        synced = self._sync_captured  # warmup runs the sync where the graphs will hold it
        count = len(inputs)
        trees = [static.tree for static in captured.inputs]
        rng = snapshot_rng([backend.default_generator(), *self._generators])
        checker = Checker(self._generators) if config.check else None
        # With the check on, the two iterations before the last are traced, with torch.compile'd code run
        # as its eager code (dispatch modes cannot see inside compiled kernels, and tracing under them would
        # recompile); the last warmup iteration always runs exactly as the capture will.
        warmup = max(config.warmup_iters, 3) if checker is not None else config.warmup_iters
        checked = (warmup - 3, warmup - 2)
        try:
            with backend.on_capture_stream():
                for iteration in range(warmup):
                    self._fill(captured, inputs)
                    self._params.zero()
                    if checker is not None and iteration in checked:
                        with eager_stance():
                            self._iteration(trees, sync=synced, checker=checker, tag=iteration)
                    else:
                        self._iteration(trees, sync=synced)
                self._params.remember_warm_grads()
        finally:
            # Warmup consumed random numbers that an eager run would not: undo it.
            restore_rng(rng)
        if checker is not None:
            regions = [*range(len(trees)), "sync"] if synced else range(len(trees))
            findings = checker.findings(compare=[((checked[0], r), (checked[1], r)) for r in regions])
            if findings:
                raise _GiveUp(_findings_message(self.config.mode, findings), findings)
        self._fill(captured, inputs)
        self._params.zero()
        what = "the full iteration" if full else "microbatch {}"
        try:
            if full:
                graph, outputs = backend.capture(
                    lambda: self._iteration(trees, sync=synced), self._generators
                )
                captured.graphs, captured.outputs = [graph], [outputs]
            else:
                for index, tree in enumerate(trees):
                    holds_sync = synced and index == count - 1
                    what = f"microbatch {index}" + (" and the gradient sync" if holds_sync else "")
                    run = self._step_then_sync if holds_sync else self._run_step
                    graph, outputs = backend.capture(
                        lambda tree=tree, run=run, i=index: run(tree, self._context(i, count)),
                        self._generators,
                    )
                    captured.graphs.append(graph)
                    captured.outputs.append(outputs)
        except CaptureFailed as failure:
            message = explain_capture_failure(
                failure.error, failure.warning_messages, what=what, checked=config.check
            )
            raise _GiveUp(message, [], failure.error) from None
        self._params.check_after_capture()

    def _fill(self, captured: _Captured, inputs: list[dict[str, Any]]) -> None:
        for static, batch in zip(captured.inputs, inputs):
            static.fill(batch)


class _GiveUp(Exception):
    """Capture is impossible for this signature; carries the message for the error or the fallback log."""

    def __init__(self, message: str, findings: list[Finding], cause: BaseException | None = None) -> None:
        super().__init__(message)
        self.message, self.findings, self.cause = message, findings, cause


def _findings_message(mode: str, findings: list[Finding]) -> str:
    lines = [f"cannot capture the step as a CUDA graph (mode {mode!r}); the pre-capture check found:"]
    lines += [f"  {i}. {finding}" for i, finding in enumerate(findings, 1)]
    lines.append(
        "Fix these in the step, or use GraphConfig(fallback='eager') to run it eagerly, or mode='eager'."
    )
    return "\n".join(lines)


def _difference_lines(expected: tuple, got: tuple) -> list[str]:
    if len(expected) != len(got):
        return [f"the iteration has {len(got)} microbatches; the graphs were captured for {len(expected)}"]
    lines: list[str] = []
    for want, have in zip(expected, got):
        lines += describe_difference(want, have)
    return lines


def _shape_message(expected: tuple, got: tuple) -> str:
    return (
        "the batches differ from the ones the graphs were captured with: "
        + "; ".join(_difference_lines(expected, got))
        + ". Pad batches to fixed shapes (vla_graph.pad_dim / pad_batch) or use "
        "GraphConfig(on_shape_change='recapture')."
    )
