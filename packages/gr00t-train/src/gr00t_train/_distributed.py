"""Process group set-up from torchrun's environment variables: NCCL on GPU, gloo on CPU, same code.

A single process without torchrun still gets a one-rank group, so every communication mode runs
(and is measured) the same way at any world size. Rank 0 speaks for the run: other ranks log warnings and
errors only, each line prefixed with its rank, so torchrun's merged output carries no duplicate lines."""

from __future__ import annotations

import gc
import logging
import os
import warnings
from dataclasses import dataclass

import torch
import torch.distributed as dist

log = logging.getLogger(__name__)


@dataclass
class DistEnv:
    """Where this process sits: its rank, the world size and its device."""

    rank: int
    world_size: int
    local_rank: int
    device: torch.device
    owns_group: bool = False

    @property
    def is_main(self) -> bool:
        """True on rank 0, the process that logs and writes shared files."""
        return self.rank == 0

    def barrier(self) -> None:
        """Wait for every rank (no-op without a process group)."""
        if dist.is_initialized() and self.world_size > 1:
            dist.barrier()

    def broadcast_object(self, obj: object) -> object:
        """Rank 0's `obj` on every rank (picklable; `obj` of other ranks is ignored)."""
        if dist.is_initialized() and self.world_size > 1:
            box = [obj]
            dist.broadcast_object_list(box, src=0)
            return box[0]
        return obj

    def all_reduce_mean(self, tensor: torch.Tensor) -> torch.Tensor:
        """Mean over ranks, in place; returns the tensor."""
        if dist.is_initialized() and self.world_size > 1:
            dist.all_reduce(tensor)
            tensor /= self.world_size
        return tensor


def device_type(preference: str) -> str:
    """ "cuda" or "cpu": what `preference` (auto, cpu, cuda) resolves to, touching no device."""
    return "cuda" if preference == "cuda" or (preference == "auto" and torch.cuda.is_available()) else "cpu"


def resolve_device(preference: str, local_rank: int = 0) -> torch.device:
    """`auto` = this rank's GPU when CUDA is available, else the CPU."""
    if preference == "cuda" and not torch.cuda.is_available():
        raise RuntimeError("device=cuda was asked for but CUDA is not available; use --set device=cpu")
    if device_type(preference) == "cuda":
        torch.cuda.set_device(local_rank)
        return torch.device("cuda", local_rank)
    return torch.device("cpu")


def init_distributed(device_preference: str = "auto") -> DistEnv:
    """Join (or create) the default process group as torchrun describes it."""
    rank = int(os.environ.get("RANK", 0))
    world_size = int(os.environ.get("WORLD_SIZE", 1))
    local_rank = int(os.environ.get("LOCAL_RANK", 0))
    device = resolve_device(device_preference, local_rank)
    quiet_other_ranks(rank)
    owns = False
    if not dist.is_initialized():
        backend = "nccl" if device.type == "cuda" else "gloo"
        if "MASTER_ADDR" in os.environ:
            dist.init_process_group(backend, init_method="env://", rank=rank, world_size=world_size)
        elif world_size == 1:
            # an in-memory store: no port to choose, so no race with another process taking it first
            dist.init_process_group(backend, store=dist.HashStore(), rank=0, world_size=1)
        else:
            raise RuntimeError(f"WORLD_SIZE={world_size} but MASTER_ADDR is not set: launch with torchrun")
        owns = True
        log.info("process group: backend %s, rank %d of %d, device %s", backend, rank, world_size, device)
        if world_size > 1:
            log.info("ranks 1..%d log warnings and errors only, prefixed with their rank", world_size - 1)
    else:
        rank, world_size = dist.get_rank(), dist.get_world_size()
    return DistEnv(rank, world_size, local_rank, device, owns)


class _RankPrefix(logging.Filter):
    def __init__(self, rank: int) -> None:
        super().__init__()
        self.rank = rank

    def filter(self, record: logging.LogRecord) -> bool:
        if not getattr(record, "_rank_prefixed", False):  # one record passes every handler
            record.msg = f"[rank {self.rank}] {record.msg}"
            record._rank_prefixed = True
        return True


def quiet_other_ranks(rank: int) -> None:
    """On ranks other than 0: warnings and errors only, prefixed with the rank; Python warnings (the same on
    every rank, e.g. deprecations) are left to rank 0."""
    if rank == 0:
        return
    root = logging.getLogger()
    root.setLevel(logging.WARNING)
    if not root.handlers:
        logging.basicConfig(format="%(asctime)s %(levelname)s %(name)s: %(message)s", datefmt="%H:%M:%S")
    for handler in root.handlers:
        if not any(isinstance(f, _RankPrefix) for f in handler.filters):
            handler.addFilter(_RankPrefix(rank))
    warnings.simplefilter("ignore")


def shutdown_distributed(env: DistEnv, peer_lost: bool = False) -> None:
    """Destroy the process group if `init_distributed` created it. After a peer was lost an NCCL group is
    aborted instead: destroying it waits for collectives that can never finish."""
    if env.owns_group and dist.is_initialized() and peer_lost and env.device.type == "cuda":
        abort = getattr(dist.distributed_c10d, "_abort_process_group", None)
        if abort is not None:
            abort()
        return
    if env.owns_group and dist.is_initialized():
        gc.collect()  # CUDA graphs (holding captured collectives) left in reference cycles go first
        if env.device.type == "cuda":
            torch.cuda.synchronize(env.device)
        dist.destroy_process_group()
