"""The three-level asynchronous pipeline between a dataset and the training step.

```
disk ─► L1 level1_workers ─► L2 level2_host ─► L3 level3_device ─► for batch in pipe
        worker processes:    a host thread:    a copy thread: pinned memory,
        decode + collate     transform into    copy stream, device_transform,
        into shared memory   a double buffer   an event per batch
```
`pipeline` (`Pipeline`: iteration, synchronous mode, checkpoints, statistics) starts the three levels
through `producer`; `handoff` holds what passes between them (bounded queues, failures, wait times).
Around them: `config` (`PipelineConfig`), `sampler` (`EpochSampler`: the order of samples and their
seeds), `mixture_sampler` (`MixtureSampler`: a mixture's order, member by weight), `routing` (which
worker loads which samples), `shm` (shared-memory arenas), `skips` (samples that cannot be decoded),
`collation` (`collate`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .._lazy import lazy_exports

_EXPORTS = {
    "Pipeline": ".pipeline",
    "PipelineConfig": ".config",
    "EpochSampler": ".sampler",
    "MixtureSampler": ".mixture_sampler",
    "collate": ".collation",
}
__all__ = [
    "EpochSampler",
    "MixtureSampler",
    "Pipeline",
    "PipelineConfig",
    "collate",
]
__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)

if TYPE_CHECKING:
    from .collation import collate
    from .config import PipelineConfig
    from .mixture_sampler import MixtureSampler
    from .pipeline import Pipeline
    from .sampler import EpochSampler
