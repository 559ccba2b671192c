"""GPU kernel time by family (GEMM, attention, elementwise, copy/cast, optimizer, NCCL, ...) from a
torch.profiler trace: where the next milliseconds are. Fused Triton kernels are named after what they fuse
(`triton_poi_fused__to_copy_add_...`), so one whose name mentions a copy or a norm counts there."""

from __future__ import annotations

import collections
from pathlib import Path

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


def by_family(prof, steps: int, top: int = 0) -> dict:
    """Milliseconds per step of every kernel family, largest first, plus the total; with `top`, also the
    `top` costliest kernels by name (ms per step, launches per step)."""
    totals: collections.Counter = collections.Counter()
    kernels: collections.Counter = collections.Counter()
    launches: collections.Counter = collections.Counter()
    for event in prof.events():
        if event.device_type == torch.autograd.DeviceType.CUDA:
            ms = event.device_time / steps / 1e3
            totals[family(event.name)] += ms
            kernels[event.name[:120]] += ms
            launches[event.name[:120]] += 1 / steps
    out: dict = {name: round(ms, 2) for name, ms in totals.most_common()}
    out["total"] = round(sum(totals.values()), 2)
    if top:
        out["top_kernels"] = [
            [name, round(ms, 3), round(launches[name], 1)] for name, ms in kernels.most_common(top)
        ]
    return out


def profile_steps(trainer, *, skip: int, active: int = 3, top: int = 40, trace: Path | None = None) -> tuple:
    """Run `trainer.fit()` with torch.profiler recording `active` steps after the first `skip`; returns fit's
    summary and the kernel time per step by family (with the `top` costliest kernels). With `trace`, the
    recorded steps' timeline is also written there (Chrome trace JSON; gzipped for a .gz name)."""
    from torch.profiler import ProfilerActivity, profile, schedule

    kinds = [ProfilerActivity.CUDA] if torch.cuda.is_available() else [ProfilerActivity.CPU]
    plan = schedule(wait=max(0, skip - 1), warmup=1, active=active, repeat=1)
    with profile(activities=kinds, schedule=plan) as prof:
        trainer.step_callback = prof.step
        try:
            summary = trainer.fit()
        finally:
            trainer.step_callback = None
    if trace is not None:
        prof.export_chrome_trace(str(trace))  # gzipped by torch when the name ends in .gz
    return summary, by_family(prof, active, top=top)
