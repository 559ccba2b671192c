"""GPU kernel time by family (GEMM, attention, elementwise, copy/cast, optimizer, NCCL, ...) from a
torch.profiler trace: where the next milliseconds are."""

from __future__ import annotations

import collections

import torch

FAMILIES = (
    ("nccl", "nccl"),
    ("attention", "flash fmha sdpa attention cudnn"),
    ("optimizer", "multi_tensor adam"),
    ("gemm", "gemm nvjet cutlass sm90 cublas xmma matmul"),
    ("norm", "norm"),
    ("copy/cast", "copy cast memcpy memset"),
    ("triton (fused elementwise)", "triton"),
)


def family(name: str) -> str:
    low = name.lower()
    return next((f for f, words in FAMILIES if any(w in low for w in words.split())), "elementwise/other")


def by_family(prof, steps: int) -> dict[str, float]:
    """Milliseconds per step of every kernel family, largest first, plus the total."""
    totals: collections.Counter = collections.Counter()
    for event in prof.events():
        if event.device_type == torch.autograd.DeviceType.CUDA:
            totals[family(event.name)] += event.device_time / steps / 1e3
    out = {name: round(ms, 2) for name, ms in totals.most_common()}
    out["total"] = round(sum(totals.values()), 2)
    return out
