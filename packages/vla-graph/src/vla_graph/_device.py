"""The device layer: every CUDA-only call (streams, graph pools, capture, replay) lives here.

Two backends share one interface. `CudaBackend` captures and replays real CUDA graphs on one process-wide
capture stream with one shared memory pool. `EmulatedBackend` (any non-CUDA device) runs the same code
path eagerly: "capture" executes the function once and "replay" executes it again, so the static
buffers, warmup, checks, gradient handling and callbacks are exercised on CPU."""

from __future__ import annotations

import contextlib
import warnings
from collections.abc import Callable, Iterator
from typing import Any

import torch

from ._random import restore_rng, snapshot_rng, unique_generators
from ._tree import copy_into

_CAPTURE_STREAMS: dict[int, Any] = {}
_POOLS: dict[int, Any] = {}


def _cuda_index(device: torch.device) -> int:
    return device.index if device.index is not None else torch.cuda.current_device()


CAPTURE_PRIORITY = -1
"""The capture stream's priority, above the default 0 of every other stream. torch instantiates graphs with
cudaGraphInstantiateFlagUseNodePriority, so a replayed kernel keeps the priority of the stream it was captured
on, whatever stream the graph is launched into. When work on an ordinary stream runs beside a replay (an
optimizer step on a side stream), the block scheduler then gives free SMs to the graph's kernels first, and
the side work fills what they leave, instead of the two taking turns kernel by kernel."""


def shared_capture_stream(device: torch.device) -> Any:
    """The one side stream every warmup and capture on `device` uses (created on first use, at
    CAPTURE_PRIORITY)."""
    index = _cuda_index(device)
    if index not in _CAPTURE_STREAMS:
        _CAPTURE_STREAMS[index] = torch.cuda.Stream(device=index, priority=CAPTURE_PRIORITY)
    return _CAPTURE_STREAMS[index]


def shared_pool(device: torch.device) -> Any:
    """The one graph memory pool every capture on `device` shares (graphs replay one at a time)."""
    index = _cuda_index(device)
    if index not in _POOLS:
        with torch.cuda.device(index):
            _POOLS[index] = torch.cuda.graph_pool_handle()
    return _POOLS[index]


def capture_stream(device: torch.device | str | int | None = None) -> contextlib.AbstractContextManager:
    """Context manager making the shared capture stream current on a CUDA device (a no-op elsewhere).

    Build gradient-hook wrappers (e.g. data-parallel wrappers) inside it: autograd's AccumulateGrad nodes
    remember the stream they were created on, and a retained node from another stream breaks capture."""
    if device is None:
        device = torch.device("cuda") if torch.cuda.is_available() else torch.device("cpu")
    device = torch.device(device) if not isinstance(device, int) else torch.device("cuda", device)
    if device.type != "cuda":
        return contextlib.nullcontext()
    return torch.cuda.stream(shared_capture_stream(device))


class CaptureFailed(Exception):
    """CUDA rejected a capture; carries the original error and the warnings raised while capturing."""

    def __init__(self, error: BaseException, warning_messages: list[str]) -> None:
        super().__init__(str(error))
        self.error = error
        self.warning_messages = warning_messages


class CudaBackend:
    """Real CUDA graphs: one capture stream and one memory pool per device, shared by every graph."""

    name = "cuda_graph"

    def __init__(self, device: torch.device, capture_error_mode: str) -> None:
        self.device = torch.device("cuda", _cuda_index(device))
        self.capture_error_mode = capture_error_mode

    def default_generator(self) -> torch.Generator:
        return torch.cuda.default_generators[self.device.index]

    @contextlib.contextmanager
    def on_capture_stream(self) -> Iterator[None]:
        """Run the body on the capture stream, ordered after and before the caller's current stream."""
        with torch.cuda.device(self.device):
            current = torch.cuda.current_stream()
            side = shared_capture_stream(self.device)
            side.wait_stream(current)
            with torch.cuda.stream(side):
                yield
            current.wait_stream(side)

    def capture(self, fn: Callable[[], Any], generators: list[torch.Generator]) -> tuple[Any, Any]:
        """Capture `fn` into a new graph; returns the graph and fn's outputs (graph-owned memory)."""
        default = self.default_generator()
        with torch.cuda.device(self.device):
            graph = torch.cuda.CUDAGraph()
            for gen in unique_generators(generators):
                if gen is not default:
                    graph.register_generator_state(gen)
            current = torch.cuda.current_stream()
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                try:
                    with torch.cuda.graph(
                        graph,
                        pool=shared_pool(self.device),
                        stream=shared_capture_stream(self.device),
                        capture_error_mode=self.capture_error_mode,
                    ):
                        outputs = fn()
                except Exception as error:
                    # A failed capture_end skips restoring the caller's stream.
                    torch.cuda.set_stream(current)
                    raise CaptureFailed(error, [str(w.message) for w in caught]) from error
        for w in caught:  # recorded for diagnosis only; a successful capture shows them as usual
            warnings.warn_explicit(w.message, w.category, w.filename, w.lineno)
        return graph, outputs

    def replay(self, graph: Any) -> None:
        with torch.cuda.device(self.device):
            graph.replay()


class EmulatedGraph:
    """Stands in for a CUDA graph off-GPU: replay runs the function again and writes the same outputs."""

    def __init__(self, fn: Callable[[], Any], outputs: Any) -> None:
        self.fn = fn
        self.outputs = outputs

    def replay(self) -> None:
        copy_into(self.outputs, self.fn())


class EmulatedBackend:
    """The same code path without graphs, for CPU (and any non-CUDA device)."""

    name = "emulated"

    def __init__(self, device: torch.device) -> None:
        self.device = device

    def default_generator(self) -> torch.Generator | None:
        return torch.default_generator if self.device.type == "cpu" else None

    def on_capture_stream(self) -> contextlib.AbstractContextManager:
        return contextlib.nullcontext()

    def capture(self, fn: Callable[[], Any], generators: list[torch.Generator]) -> tuple[Any, Any]:
        # A real capture runs no kernels and consumes no random numbers; undo what running fn consumed.
        state = snapshot_rng([self.default_generator(), *generators])
        try:
            outputs = fn()
        finally:
            restore_rng(state)
        return EmulatedGraph(fn, outputs), outputs

    def replay(self, graph: EmulatedGraph) -> None:
        graph.replay()


def backend_for(device: torch.device, capture_error_mode: str) -> CudaBackend | EmulatedBackend:
    """Real graphs on CUDA devices, emulation everywhere else."""
    if device.type == "cuda":
        return CudaBackend(device, capture_error_mode)
    return EmulatedBackend(device)
