"""The capture check: run a step eagerly under torch's function and dispatch modes and name every op that
a CUDA graph cannot hold, with the line of user code that issued it and what to do instead.

It sees three kinds of trouble before capture starts (a failed capture can leave the process unusable):
host syncs (`.item()`, `.cpu()`, printing, `if tensor:`), outputs whose size depends on tensor values
(`nonzero`, boolean-mask indexing), random numbers from unregistered generators; and, by comparing two
iterations op by op, Python control flow or Python numbers that change between iterations (a graph
replays what ran at capture, with the numbers it saw then)."""

from __future__ import annotations

import contextlib
import functools
import os
import sys
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any

import torch
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode

# Frames skipped when naming the user's line: torch, this package, and context-manager plumbing.
_SKIP_DIRS = (os.path.dirname(torch.__file__) + os.sep, os.path.dirname(__file__) + os.sep)
_SKIP_FILES = frozenset({contextlib.__file__, functools.__file__})

HOST_SYNC = "host sync"
DYNAMIC_SHAPE = "data-dependent size"
GENERATOR = "unregistered generator"
BRANCH = "CPU-dependent branch"
PYTHON_NUMBER = "changing Python number"

_ADVICE = {
    HOST_SYNC: "it copies a tensor value to the host and waits for the GPU, which a graph cannot do. Keep "
    "the value on the device (torch.where instead of `if`, metrics as tensors read after the step) or "
    "move this code outside the step",
    DYNAMIC_SHAPE: "its output size depends on tensor values, but a graph fixes every size at capture (and "
    "computing the size needs a host sync). Use a fixed-size form: masks with torch.where or "
    "masked_fill, torch.nonzero_static(size=...), or pad to a fixed length (vla_graph.pad_dim)",
    GENERATOR: "it draws from a torch.Generator that is not registered with the graph, so every replay "
    "would repeat (or fail on) the same numbers. Pass it as GraphedStep(generators=[...]) or draw the "
    "numbers outside the step with GraphedStep(draw=...)",
}

# Python-level tensor methods that read values on the host.
_HOST_METHODS = {
    "item": ".item()",
    "tolist": ".tolist()",
    "numpy": ".numpy()",
    "cpu": ".cpu()",
    "__bool__": "bool(tensor) / `if tensor:`",
    "__int__": "int(tensor)",
    "__float__": "float(tensor)",
    "__index__": "using a tensor as a Python index",
    "__repr__": "printing a tensor",
    "__str__": "printing a tensor",
    "__format__": "formatting a tensor",
    "pin_memory": ".pin_memory()",
}
_HOST_OPS = {
    "_local_scalar_dense": "reading a tensor value on the host",
    "equal": "torch.equal",
    "is_nonzero": "bool(tensor)",
}
_DYNAMIC_OPS = {
    "nonzero": "nonzero / torch.where(cond) / argwhere",
    "masked_select": "masked_select",
    "unique": "unique",
    "_unique": "unique",
    "_unique2": "unique",
    "unique_dim": "unique",
    "unique_consecutive": "unique_consecutive",
    "bincount": "bincount",
}


def eager_stance() -> contextlib.AbstractContextManager:
    """Run torch.compile'd callables as their original Python code (torch >= 2.6; elsewhere a no-op).

    The check traces ops with Python modes; compiled code would hide its ops from them and be recompiled for
    the modes. Its eager code issues the same kinds of ops (more, if anything), so it is what gets checked."""
    set_stance = getattr(torch.compiler, "set_stance", None)
    return set_stance("force_eager") if set_stance is not None else contextlib.nullcontext()


@dataclass(frozen=True)
class Finding:
    """One reason a step cannot be captured: what happened, where, and what to do instead."""

    kind: str
    """One of "host sync", "data-dependent size", "unregistered generator", "CPU-dependent branch",
    "changing Python number"."""
    op: str
    """The operation, e.g. ".item()" or "aten.nonzero"."""
    where: str
    """The user code that issued it (file:line (function)), or the backward node."""
    advice: str

    def __str__(self) -> str:
        return f"[{self.kind}] {self.op} at {self.where}: {self.advice}"


@functools.lru_cache(maxsize=1024)
def _display_path(path: str) -> str:
    with contextlib.suppress(ValueError):
        rel = os.path.relpath(path)
        return path if rel.startswith("..") else rel
    return path


def _user_location() -> str:
    """file:line (function) of the innermost frame outside torch and vla_graph; notes backward."""
    frame = sys._getframe(2)
    while frame is not None and (
        frame.f_code.co_filename.startswith(_SKIP_DIRS) or frame.f_code.co_filename in _SKIP_FILES
    ):
        frame = frame.f_back
    where = "unknown location"
    if frame is not None:
        code = frame.f_code
        where = f"{_display_path(code.co_filename)}:{frame.f_lineno} ({code.co_name})"
    node = torch._C._current_autograd_node()
    return f"{where}, in backward ({node.name()})" if node is not None else where


_PLAIN_TYPES = frozenset(
    {bool, int, float, str, type(None), torch.dtype, torch.device, torch.layout, torch.memory_format}
)


def _plain(value: Any) -> Any:
    """Non-tensor arguments of an op, as comparable values (tensors and generators as markers)."""
    kind = type(value)
    if kind in _PLAIN_TYPES:
        return value
    if isinstance(value, torch.Tensor):
        return "<tensor>"
    if kind is list or kind is tuple:
        return tuple(_plain(v) for v in value)
    if kind is dict:
        return tuple((k, _plain(v)) for k, v in value.items())
    if isinstance(value, torch.Generator):
        return "<generator>"
    return kind.__name__


def _is_bool_index(indices: Any) -> bool:
    return isinstance(indices, (list, tuple)) and any(
        isinstance(i, torch.Tensor) and i.dtype in (torch.bool, torch.uint8) for i in indices
    )


class _Recorder:
    """Shared state of the two modes: findings, per-region op traces, and a depth that hides the aten ops
    issued inside an already-reported Python-level call."""

    def __init__(self, registered: Iterable[torch.Generator]) -> None:
        self.registered = list(registered)
        self.findings: dict[tuple[str, str, str], Finding] = {}
        self.traces: dict[Any, list[tuple[str, Any, str]]] = {}
        self.region: Any = None
        self.hidden = 0

    def add(self, kind: str, op: str, detail: str = "") -> None:
        where = _user_location()
        advice = (f"{detail}; " if detail else "") + _ADVICE[kind]
        self.findings.setdefault((kind, op, where), Finding(kind, op, where, advice))

    def _is_default(self, gen: torch.Generator) -> bool:
        if gen.device.type == "cpu":
            return gen is torch.default_generator
        if gen.device.type == "cuda":
            return gen is torch.cuda.default_generators[gen.device.index or 0]
        return False

    def on_python_call(self, func: Any, args: tuple, kwargs: dict) -> bool:
        """Report a host-reading method or an unregistered generator; True hides the call's aten ops."""
        for value in (*args, *kwargs.values()):
            if (
                isinstance(value, torch.Generator)
                and not self._is_default(value)
                and not any(value is gen for gen in self.registered)
            ):
                self.add(GENERATOR, getattr(func, "__name__", str(func)))
        name = getattr(func, "__name__", "")
        if name in _HOST_METHODS:
            self.add(HOST_SYNC, _HOST_METHODS[name])
            return True
        if name == "to" and _moves_to_host(args, kwargs):
            self.add(HOST_SYNC, ".to('cpu')")
            return True
        return False

    def on_op(self, func: Any, args: tuple, kwargs: dict) -> None:
        if self.hidden:
            return
        name = func.overloadpacket.__name__
        if name in _HOST_OPS:
            self.add(HOST_SYNC, f"aten.{name}", _HOST_OPS[name])
        elif name in _DYNAMIC_OPS:
            self.add(DYNAMIC_SHAPE, f"aten.{name}", _DYNAMIC_OPS[name])
        elif name == "index" and len(args) > 1 and _is_bool_index(args[1]):
            self.add(DYNAMIC_SHAPE, "aten.index", "boolean-mask indexing x[mask]")
        elif name in ("index_put", "index_put_") and _is_bool_index(args[1]) and args[2].numel() != 1:
            self.add(DYNAMIC_SHAPE, f"aten.{name}", "assigning a tensor through a boolean mask x[mask] = v")
        elif (
            name == "repeat_interleave"
            and kwargs.get("output_size") is None
            and isinstance(args[-1], torch.Tensor)
        ):
            self.add(
                DYNAMIC_SHAPE,
                "aten.repeat_interleave",
                "repeat_interleave with tensor repeats and no output_size",
            )
        elif name in ("_to_copy", "copy_") and _copies_to_host(name, args, kwargs):
            self.add(HOST_SYNC, f"aten.{name}", "a device-to-host copy")
        if self.region is not None:
            plain = (_plain(args), _plain(kwargs))
            self.traces.setdefault(self.region, []).append((str(func), plain, _user_location()))


def _moves_to_host(args: tuple, kwargs: dict) -> bool:
    tensor = args[0] if args and isinstance(args[0], torch.Tensor) else None
    targets = [*args[1:], kwargs.get("device")]
    to_cpu = any(t == "cpu" or (isinstance(t, torch.device) and t.type == "cpu") for t in targets)
    return to_cpu and tensor is not None and tensor.device.type != "cpu"


def _copies_to_host(name: str, args: tuple, kwargs: dict) -> bool:
    if name == "_to_copy":
        device = kwargs.get("device")
        return device is not None and torch.device(device).type == "cpu" and args[0].device.type != "cpu"
    dst, src = args[0], args[1]
    return isinstance(src, torch.Tensor) and dst.device.type == "cpu" and src.device.type != "cpu"


class _FunctionMode(TorchFunctionMode):
    def __init__(self, recorder: _Recorder) -> None:
        super().__init__()
        self.recorder = recorder

    def __torch_function__(self, func, types, args=(), kwargs=None):  # noqa: ANN001
        kwargs = kwargs or {}
        if not self.recorder.on_python_call(func, args, kwargs):
            return func(*args, **kwargs)
        self.recorder.hidden += 1
        try:
            return func(*args, **kwargs)
        finally:
            self.recorder.hidden -= 1


class _DispatchMode(TorchDispatchMode):
    def __init__(self, recorder: _Recorder) -> None:
        super().__init__()
        self.recorder = recorder

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # noqa: ANN001
        kwargs = kwargs or {}
        self.recorder.on_op(func, args, kwargs)
        return func(*args, **kwargs)


class Checker:
    """Records findings and op traces while regions of a step run eagerly; compares regions afterwards."""

    def __init__(self, registered_generators: Iterable[torch.Generator] = ()) -> None:
        self._recorder = _Recorder(registered_generators)

    @contextlib.contextmanager
    def watching(self, region: Any) -> Iterator[None]:
        """Check everything that runs inside; keep its op trace under the key `region`."""
        recorder = self._recorder
        recorder.region = region
        try:
            with _FunctionMode(recorder), _DispatchMode(recorder):
                yield
        finally:
            recorder.region = None

    def findings(self, compare: Iterable[tuple[Any, Any]] = ()) -> list[Finding]:
        """Every op finding, then the first difference between each pair of (earlier, later) regions."""
        found = list(self._recorder.findings.values())
        traces = self._recorder.traces
        for before, after in compare:
            difference = _first_difference(traces.get(before, []), traces.get(after, []), after)
            if difference is not None:
                found.append(difference)
        return found


def _first_difference(before: list, after: list, region: Any) -> Finding | None:
    for index, (old, new) in enumerate(zip(before, after)):
        if old[0] != new[0]:
            return Finding(
                BRANCH,
                f"{old[0]} then {new[0]}",
                new[2],
                f"op #{index} of {_region_name(region)} was {old[0]} (at {old[2]}) in one iteration and "
                f"{new[0]} in the next. A graph replays only the ops that ran at capture, so Python control "
                "flow that depends on CPU state (counters, flags, values read from tensors) is frozen. "
                "Express the choice with tensor ops (torch.where) or keep that state fixed during training",
            )
        if old[1] != new[1]:
            return Finding(
                PYTHON_NUMBER,
                old[0],
                new[2],
                f"the Python arguments of op #{index} of {_region_name(region)} changed between iterations "
                f"({_short(old[1])} then {_short(new[1])}). A graph replays the value it saw at capture. "
                "Pass the number as a tensor (a batch entry or a buffer updated in place)",
            )
    if len(before) != len(after):
        shorter, longer = (before, after) if len(before) < len(after) else (after, before)
        extra = longer[len(shorter)]
        return Finding(
            BRANCH,
            extra[0],
            extra[2],
            f"{_region_name(region)} ran {len(before)} op(s) in one iteration and {len(after)} in the next, "
            f"first extra op {extra[0]}. A graph replays only the ops that ran at capture; make the step run "
            "the same ops every iteration (tensor ops such as torch.where instead of Python branches)",
        )
    return None


def _region_name(region: Any) -> str:
    if isinstance(region, tuple) and len(region) == 2:
        return "the gradient sync" if region[1] == "sync" else f"microbatch {region[1]}"
    return f"run {region}"


def _short(value: Any, limit: int = 120) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def check_graph_safe(
    fn: Callable[[], Any], *, runs: int = 3, generators: Iterable[torch.Generator] = ()
) -> list[Finding]:
    """Run `fn()` eagerly `runs` times and return everything that would stop it from being captured.

    Works on CPU too. `fn` really runs (a training step accumulates gradients). Every run is checked for
    unsafe ops; the last two runs are also compared op by op to find Python branches and Python numbers
    that change between iterations (earlier runs are warmup: lazy initialisation may differ there, as
    the first backward creating `.grad` does)."""
    if runs < 1:
        raise ValueError(f"runs={runs!r} must be >= 1")
    checker = Checker(generators)
    for run in range(runs):
        with checker.watching(run):
            fn()
    return checker.findings(compare=[(runs - 2, runs - 1)] if runs >= 2 else [])
