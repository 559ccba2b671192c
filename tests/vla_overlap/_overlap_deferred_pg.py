"""A process group whose collectives deliver their results only on wait().

At launch a collective is computed (on a private copy, through an inner gloo group) and every buffer it
may write is filled with NaN; `wait()` first checks that nobody wrote into those buffers meanwhile, then
writes the result. So code that reads a buffer before waiting for it, or writes into a buffer that is in
flight, fails deterministically instead of racing. After a reduce-scatter the part of the input a rank
does not own stays NaN: its contents are unspecified (NCCL leaves the input, gloo emulations reduce it).
Every launch is logged as (op, data_ptr, numel) for dispatch-order checks.
"""

from __future__ import annotations

import torch
import torch.distributed as dist


def _poisoned(t: torch.Tensor) -> bool:
    return bool(torch.isnan(t).all())


class DeferredWork(dist.Work):
    def __init__(self, writes: list[tuple[torch.Tensor, torch.Tensor | None]], what: str) -> None:
        super().__init__()
        self._writes = writes  # (destination, result or None = leave poisoned)
        self._what = what
        self._done = False

    def wait(self, timeout=None) -> bool:  # noqa: ANN001 - signature of dist.Work.wait
        if not self._done:
            for dest, _ in self._writes:
                if not _poisoned(dest):
                    raise RuntimeError(f"deferred {self._what}: a buffer was written while in flight")
            for dest, result in self._writes:
                if result is not None:
                    dest.copy_(result)
            self._done = True
        return True

    def is_completed(self) -> bool:
        return self._done


class DeferredProcessGroup(dist.ProcessGroup):
    def __init__(self, store, rank: int, size: int, timeout) -> None:  # noqa: ANN001
        super().__init__(rank, size)
        self._rank, self._size = rank, size
        self.inner = dist.ProcessGroupGloo(dist.PrefixStore("deferred-inner", store), rank, size, timeout)
        self.log: list[tuple[str, int, int]] = []

    def getBackendName(self) -> str:
        return "deferred"

    def _sum(self, tensor: torch.Tensor) -> torch.Tensor:
        out = tensor.clone()
        opts = dist.AllreduceOptions()
        opts.reduceOp = dist.ReduceOp.SUM
        self.inner.allreduce([out], opts).wait()
        return out

    # all_reduce
    def allreduce(self, tensors, opts=None):  # noqa: ANN001
        (tensor,) = tensors
        result = tensor.clone()
        self.inner.allreduce([result], opts if opts is not None else dist.AllreduceOptions()).wait()
        self.log.append(("all_reduce", tensor.data_ptr(), tensor.numel()))
        tensor.fill_(float("nan"))
        return DeferredWork([(tensor, result)], "all_reduce")

    # reduce_scatter into a flat output (the name changed across torch releases)
    def reduce_scatter_single(self, output, input, opts=None):  # noqa: ANN001
        result = self._sum(input).chunk(self._size)[self._rank].clone()
        self.log.append(("reduce_scatter", input.data_ptr(), input.numel()))
        input.fill_(float("nan"))
        output.fill_(float("nan"))
        return DeferredWork([(input, None), (output, result)], "reduce_scatter")

    _reduce_scatter_base = reduce_scatter_single

    # all_gather into a flat output
    def all_gather_single(self, output, input, opts=None):  # noqa: ANN001
        full = torch.zeros_like(output)
        full.chunk(self._size)[self._rank].copy_(input)
        result = self._sum(full)
        self.log.append(("all_gather", output.data_ptr(), output.numel()))
        output.fill_(float("nan"))
        return DeferredWork([(output, result)], "all_gather")

    _allgather_base = all_gather_single

    def broadcast(self, tensors, opts=None):  # noqa: ANN001
        return self.inner.broadcast(tensors, opts)

    def barrier(self, opts=None):  # noqa: ANN001
        return self.inner.barrier()


def _create(store, rank, size, timeout):  # noqa: ANN001, ANN202
    return DeferredProcessGroup(store, rank, size, timeout)


def register() -> None:
    if "deferred" not in dist.Backend.backend_list:
        dist.Backend.register_backend("deferred", _create, devices=["cpu"])
