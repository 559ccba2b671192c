"""What the ablation ladder's baseline rows run and no library needs: torch DDP behind the GradSync protocol."""

from __future__ import annotations

from contextlib import AbstractContextManager

from torch import nn


class DDPGradSync:
    """torch DistributedDataParallel as a GradSync: DDP reduces from its own hooks during the last backward,
    so start/finish have nothing left to do. Eager only (the config refuses graphs with comm=ddp)."""

    def __init__(self, ddp: nn.parallel.DistributedDataParallel) -> None:
        self._ddp = ddp

    def zero(self) -> None:
        self._ddp.zero_grad(set_to_none=True)

    def no_sync(self) -> AbstractContextManager:
        return self._ddp.no_sync()

    def launch_in_backward(self) -> AbstractContextManager:
        raise RuntimeError("torch DDP cannot run inside CUDA graphs (comm=ddp needs graph=eager)")

    def start(self) -> None:
        pass

    def finish(self) -> None:
        pass

    def mark_synced(self) -> None:
        pass
