"""Seconds a process spends on the compile work torch.compile's own timers leave out, printed at its exit.

Put this folder on PYTHONPATH (`TIMERS=1 bash benchmarks/device_checks.sh startup` does) and every Python
process started with it times, in-process: Inductor's multi-kernel calls picking their faster sub-kernel
(`MultiKernelCall.benchmark_sub_kernels`, run at a reduction's first call when no pick is cached) and Triton
compiles (`triton.compiler.compile`, a cache hit included: a few ms). At exit a process that did either prints
one line to stderr: `TIMER pid N {mk_bench_s, mk_bench_n, triton_compile_s, triton_compile_n}`. Inductor's
compile workers compile its own kernels in other processes; what this counts is the training process's.
"""

import atexit
import os
import sys
import time

_totals = {"mk_bench_s": 0.0, "mk_bench_n": 0, "triton_compile_s": 0.0, "triton_compile_n": 0}


def _timed(fn, seconds: str, count: str):
    def call(*args, **kwargs):
        started = time.perf_counter()
        try:
            return fn(*args, **kwargs)
        finally:
            _totals[seconds] += time.perf_counter() - started
            _totals[count] += 1

    return call


def _report() -> None:
    if _totals["mk_bench_n"] or _totals["triton_compile_n"]:
        print(f"TIMER pid {os.getpid()} {_totals}", file=sys.stderr, flush=True)


try:
    from torch._inductor.codegen.multi_kernel import MultiKernelCall

    MultiKernelCall.benchmark_sub_kernels = _timed(
        MultiKernelCall.benchmark_sub_kernels, "mk_bench_s", "mk_bench_n"
    )
    import triton.compiler
    import triton.compiler.compiler as triton_compiler

    original = triton_compiler.compile
    triton_compiler.compile = _timed(original, "triton_compile_s", "triton_compile_n")
    if getattr(triton.compiler, "compile", None) is original:
        triton.compiler.compile = triton_compiler.compile
    atexit.register(_report)
except Exception as err:  # noqa: BLE001 - a probe: say why and leave the process alone
    print(f"TIMER not applied: {err!r}", file=sys.stderr)
