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


def capture(fn: Callable[[], object], warmup: int = 3) -> tuple[torch.cuda.CUDAGraph, object]:
    """`fn` warmed up `warmup` times on a side stream (compilation, allocation), then captured once in a CUDA
    graph: the graph and what the captured call returned (its static outputs)."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(warmup):
            fn()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = fn()
    return graph, out


def cuda_graph_ms(fn: Callable[[], object], calls: int = 20, replays: int = 5) -> float:
    """Milliseconds per call of `fn` with `calls` calls captured in one CUDA graph and replayed: the GPU time
    of kernels too short to time from Python, whose launches would otherwise set the pace."""
    graph, _ = capture(lambda: [fn() for _ in range(calls)], warmup=1)
    graph.replay()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(replays):
        graph.replay()
    end.record()
    end.synchronize()
    return start.elapsed_time(end) / (replays * calls)
