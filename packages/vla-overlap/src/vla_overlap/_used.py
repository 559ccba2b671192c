"""Which parameters some rank used this step (allow_unused_params only), so nobody steps the others.

torch DDP leaves `.grad` None for a parameter that no rank used in a step, and AdamW then skips it (no weight
decay, no momentum). To do the same, ranks must agree on "used anywhere": one small all-reduce of a flag per
parameter. Whether a rank has unused parameters is local knowledge, so gating the collective on it would
leave ranks issuing different collectives (a hang); it runs on every step of a wrapper built with
`allow_unused_params=True` (the same decision on every rank), and never otherwise.
"""

from __future__ import annotations

from typing import Any

import torch

from ._comm import CommStream, Communicator


def _capturing(device: torch.device) -> bool:
    return device.type == "cuda" and torch.cuda.is_current_stream_capturing()


class UsedFlags:
    """One step's "used by any rank" agreement: `launch(seen)` after the buckets, `wait()` -> unused slots."""

    def __init__(self, comm: Communicator, stream: CommStream, device: torch.device) -> None:
        self.comm, self.stream, self.device = comm, stream, device
        self._flags: torch.Tensor | None = None
        self._handle: Any = None

    def launch(self, seen: list[bool]) -> None:
        """Start the agreement. `seen`: which parameters got a gradient through Python on this rank. None
        did when a replayed CUDA graph wrote the buffers: then everything counts as used. Inside a capture
        (uniform over ranks) nothing is launched: a host-built tensor cannot enter a graph, and a replayed
        graph is treated as using everything anyway."""
        if _capturing(self.device):
            return
        local = seen if any(seen) else [True] * len(seen)
        flags = torch.tensor(local, dtype=torch.int32)
        with self.stream.launch():
            self._flags = flags.to(self.device)
            if self.comm.size > 1:
                self._handle = self.comm.all_reduce(self._flags)

    def wait(self) -> frozenset[int]:
        """The parameters (slot indices) that no rank used; empty when nothing was launched."""
        flags, handle, self._flags, self._handle = self._flags, self._handle, None, None
        if flags is None:
            return frozenset()
        if handle is not None:
            handle.wait()
        self.stream.join()
        return frozenset(i for i, count in enumerate(flags.tolist()) if count == 0)
