"""The collectives we need, under whatever names this torch version gives them, and the CUDA side stream.

Everything CUDA-specific sits here so that the bucket logic runs unchanged on CPU with gloo, where
collectives are asynchronous on gloo's own threads and streams do not exist.
"""

from __future__ import annotations

import atexit
import ctypes
import os
import time
from collections import deque
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import torch
import torch.distributed as dist

# Tensors handed to asynchronous collectives, kept referenced (far more than one step issues).
_RECENT: deque[tuple[torch.Tensor, ...]] = deque(maxlen=1024)


@atexit.register
def _let_backend_threads_settle_at_exit() -> None:
    """gloo's run-loop threads drop a finished collective (and the tensors it holds) a little after wait()
    returns. If that happens once interpreter shutdown has begun, freeing a tensor's Python object needs the
    GIL, which kills the thread inside a C++ destructor: the process aborts with "terminate called without
    an active exception" (about one gloo run in six exited so on a busy 2-core machine). So at exit, while
    Python still runs, wait (at most 2 s) until those threads sleep, and keep the recent tensors alive."""
    if not _RECENT:
        return
    deadline = time.monotonic() + 2.0
    while time.monotonic() < deadline and _backend_threads_busy():
        time.sleep(0.005)
    for tensors in _RECENT:
        for tensor in tensors:
            for keep in (tensor, tensor._base):
                if keep is not None:
                    ctypes.pythonapi.Py_IncRef(ctypes.py_object(keep))  # a deliberate leak: the process ends


def _backend_threads_busy() -> bool:
    """Whether a gloo run-loop thread of this process is running (not asleep), from /proc (Linux)."""
    try:
        tasks = os.listdir("/proc/self/task")
    except OSError:
        return False
    for task in tasks:
        try:
            with open(f"/proc/self/task/{task}/stat") as f:
                stat = f.read()
        except OSError:
            continue
        name, state = stat[stat.index("(") + 1 : stat.rindex(")")], stat[stat.rindex(")") + 2]
        if name.startswith("pt_gloo") and state == "R":
            return True
    return False


def first_available(module: Any, *names: str) -> Callable[..., Any]:
    """The first of `names` that `module` defines: collectives were renamed across torch releases
    (`_reduce_scatter_base` -> `reduce_scatter_tensor` -> `reduce_scatter_single`), and calling a
    deprecated name warns on every call."""
    for name in names:
        found = getattr(module, name, None)
        if found is not None:
            return found
    raise RuntimeError(f"this torch.distributed has none of {names}; vla-overlap needs torch >= 2.6")


def _reduce_scatter(output: torch.Tensor, input: torch.Tensor, group: Any) -> Any:
    fn = first_available(dist, "reduce_scatter_single", "reduce_scatter_tensor", "_reduce_scatter_base")
    return fn(output, input, dist.ReduceOp.SUM, group, True)


def _all_gather(output: torch.Tensor, input: torch.Tensor, group: Any) -> Any:
    fn = first_available(dist, "all_gather_single", "all_gather_into_tensor", "_all_gather_base")
    return fn(output, input, group, True)


class Communicator:
    """Asynchronous collectives over one process group; each returns a handle with `wait()`."""

    def __init__(self, group: dist.ProcessGroup | None) -> None:
        if not (dist.is_available() and dist.is_initialized()):
            raise RuntimeError(
                "vla_overlap needs torch.distributed: call torch.distributed.init_process_group(...) first "
                "(a world size of 1 is fine)"
            )
        # The default group is looked up on use, not held: destroy_process_group() must be able to free it
        # (and join gloo's threads) while Python is still running, not at interpreter exit.
        self._group = group
        self.rank = dist.get_rank(self.group)
        self.size = dist.get_world_size(self.group)
        if self.rank < 0:
            raise ValueError("this process is not a member of the given process_group")
        self._first_global_rank = dist.get_global_rank(self.group, 0)
        # Only gloo's threads free tensors late (see above); elsewhere keeping them would only hold memory.
        self._recent = _RECENT if dist.get_backend(self.group) == "gloo" else deque(maxlen=0)

    @property
    def group(self) -> dist.ProcessGroup:
        return self._group if self._group is not None else dist.group.WORLD

    def all_reduce(self, tensor: torch.Tensor) -> Any:
        """In-place SUM, asynchronous."""
        self._recent.append((tensor,))
        return dist.all_reduce(tensor, op=dist.ReduceOp.SUM, group=self.group, async_op=True)

    def reduce_scatter(self, output: torch.Tensor, input: torch.Tensor) -> Any:
        """SUM of `input` over ranks; this rank's 1/size slice lands in `output` (may be a view of input)."""
        self._recent.append((output, input))
        return _reduce_scatter(output, input, self.group)

    def all_gather(self, output: torch.Tensor, input: torch.Tensor) -> Any:
        """Concatenation of every rank's `input` into `output` (input may be a view of output)."""
        self._recent.append((output, input))
        return _all_gather(output, input, self.group)

    def all_reduce_now(self, tensor: torch.Tensor, op: Any = dist.ReduceOp.SUM) -> None:
        dist.all_reduce(tensor, op=op, group=self.group)

    def broadcast_now(self, tensor: torch.Tensor) -> None:
        """Overwrite `tensor` with the group's first rank's copy."""
        dist.broadcast(tensor, src=self._first_global_rank, group=self.group)


class CommStream:
    """A side stream for collectives on CUDA; does nothing on other devices.

    The side stream first waits for everything already queued on the current stream (the gradients or
    parameters a collective reads), and `join()` makes the current stream wait for the side stream before
    anyone reads the results.
    """

    def __init__(self, device: torch.device) -> None:
        self._stream = torch.cuda.Stream(device) if device.type == "cuda" else None
        self._device = device
        self._forked = False

    @contextmanager
    def launch(self) -> Iterator[None]:
        if self._stream is None:
            yield
            return
        self._stream.wait_stream(torch.cuda.current_stream(self._device))
        self._forked = True
        with torch.cuda.stream(self._stream):
            yield

    def join(self) -> None:
        # Only after a launch: inside CUDA graph capture, waiting on a side stream that never joined the
        # capture would be an illegal dependency on uncaptured work.
        if self._stream is not None and self._forked:
            torch.cuda.current_stream(self._device).wait_stream(self._stream)
            self._forked = False
