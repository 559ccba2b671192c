"""GPU time of a callable, by CUDA events: what the probe scripts time their variants with."""

from __future__ import annotations

from collections.abc import Callable

import torch


def cuda_ms(fn: Callable[[], object], iters: int = 20, warmup: int = 3) -> float:
    """Milliseconds per call of `fn`, averaged over `iters` calls queued back to back after `warmup` calls
    (compilation, autotuning and allocation happen there)."""
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(iters):
        fn()
    end.record()
    end.synchronize()
    return start.elapsed_time(end) / iters
