"""GraphConfig: how a training step is run (eager or graphed) and what happens when capture is impossible."""

from __future__ import annotations

from dataclasses import dataclass

MODES = ("eager", "full_iteration", "per_microbatch")
SHAPE_POLICIES = ("error", "recapture")
FALLBACKS = ("error", "eager")
CAPTURE_ERROR_MODES = ("global", "thread_local", "relaxed")


def _check_choice(field: str, value: object, allowed: tuple[str, ...]) -> None:
    if value not in allowed:
        raise ValueError(f"GraphConfig.{field}={value!r} is not allowed; choose one of {', '.join(allowed)}")


def _check_int(field: str, value: object, minimum: int) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or value < minimum:
        raise ValueError(f"GraphConfig.{field}={value!r} must be an int >= {minimum}")


@dataclass(kw_only=True)
class GraphConfig:
    """How `GraphedStep` runs one training iteration (a list of microbatches)."""

    mode: str = "per_microbatch"
    """"eager" (no graphs: the reference and debugging path), "full_iteration" (every microbatch of the
    iteration captured as one graph) or "per_microbatch" (one forward+backward graph per microbatch
    position, replayed in order). Where the gradient sync runs: `sync_in_graph`."""

    sync_in_graph: bool = True
    """With a `grad_sync` object, in graph modes: capture the gradient sync in the graphs (per_microbatch: at
    the end of the last microbatch's graph; full_iteration: at the end of the one graph), the last backward
    running under `grad_sync.launch_in_backward()` so the collectives its hooks launch overlap with it at
    replay; `mark_synced()` follows each replay. Every rank must capture the same collectives (NCCL allows
    them in graphs). False: the last backward only accumulates and `start()`/`finish()` run eagerly after
    the replays (no overlap). Without a grad_sync object nothing is synchronized."""

    warmup_iters: int = 3
    """Eager iterations on the capture stream before capturing (cuBLAS handles, autotuning, lazy init).
    Use >= 11 when torch DistributedDataParallel runs inside the captured region."""

    check: bool = True
    """Trace the last two warmup iterations and refuse to capture steps that sync with the host, allocate
    data-dependent sizes, draw from unregistered generators or branch differently between iterations."""

    on_shape_change: str = "error"
    """What a batch with a different shape, dtype, device or Python value does: "error" raises
    ShapeChangeError naming the key; "recapture" captures (and caches) another graph set for it."""

    max_captures: int = 8
    """With on_shape_change="recapture": the most graph sets kept, one per distinct batch signature."""

    fallback: str = "error"
    """When a step cannot be captured: "error" raises GraphCaptureError; "eager" logs why and runs that
    batch signature eagerly from then on (GraphedStep.report records it)."""

    capture_error_mode: str = "thread_local"
    """cudaStreamCaptureMode: "thread_local" lets other threads (data loading, copy streams) use CUDA
    during capture; "global" forbids it; "relaxed" disables the checks."""

    def __post_init__(self) -> None:
        _check_choice("mode", self.mode, MODES)
        _check_int("warmup_iters", self.warmup_iters, 1)
        if not isinstance(self.sync_in_graph, bool):
            raise ValueError(f"GraphConfig.sync_in_graph={self.sync_in_graph!r} must be True or False")
        if not isinstance(self.check, bool):
            raise ValueError(f"GraphConfig.check={self.check!r} must be True or False")
        _check_choice("on_shape_change", self.on_shape_change, SHAPE_POLICIES)
        _check_int("max_captures", self.max_captures, 1)
        _check_choice("fallback", self.fallback, FALLBACKS)
        _check_choice("capture_error_mode", self.capture_error_mode, CAPTURE_ERROR_MODES)
