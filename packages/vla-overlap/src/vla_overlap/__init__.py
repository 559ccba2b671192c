"""vla-overlap: data parallelism that hides gradient and parameter communication behind compute.

`OverlapDataParallel` reduces gradients bucket by bucket during backward; `DistributedAdamW` adds ZeRO-1
(sharded fp32 master weights and AdamW state, reduce-scatter, parameter all-gather prefetched in forward);
`GradSync` is the one object a step runner drives to synchronize gradients; `UpdateStream` runs the optimizer
step on a side stream while the next step's work that reads no trainable parameter runs.
"""

from .__about__ import __version__
from ._config import OverlapConfig
from ._layout import Layout, plan_layout
from ._moments8 import MOMENT_BYTES
from ._moments8_state import decode_moments
from ._optimizer import DistributedAdamW
from ._sync import GradSync, OverlapGradSync
from ._update_stream import UpdateStream
from ._wrapper import OverlapDataParallel

__all__ = [
    "DistributedAdamW",
    "GradSync",
    "Layout",
    "MOMENT_BYTES",
    "OverlapConfig",
    "OverlapDataParallel",
    "OverlapGradSync",
    "UpdateStream",
    "__version__",
    "decode_moments",
    "plan_layout",
]
