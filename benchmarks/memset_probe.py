"""Where the step's 4-byte memsets come from, and what they cost.

    PYTHONPATH=<the packages' src folders> python benchmarks/memset_probe.py [--json OUT]

The full stack's graphed step (tenth pass trace) runs about 430 `cudaMemsetAsync` of 4 bytes per step, one in
front of nearly every GEMM and cuDNN attention call, each followed by a ~3 us gap. This probe runs each GEMM
form of the step (plain, with bias, with the GELU epilogue, the transposed backward forms) and a cuDNN
attention call, 20 calls in a CUDA graph, under library and workspace settings that must be chosen before
cuBLAS starts (so each setting runs in a child process), and reports the memsets per call and the time per
call.

Found (h200, torch 2.11+cu130, 2026-12-02; BENCHMARKS.md, tenth pass): the memset zeroes the tile counter of
cuBLAS's dynamic-scheduler kernels. With no cuBLAS workspace (CUBLAS_WORKSPACE_CONFIG=:0:0) cuBLAS picks the
static-scheduler twins (`ssched` in the name), which need none and are as fast; cuDNN's attention keeps its
memset under every setting. Rewriting the captured memset nodes as fill-kernel nodes (tried with the driver
API) won back only 0.9 of the 3.8 us each costs, so it was not kept.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys

SETTINGS = {
    "default": {},
    "cublaslt": {"PROBE_BLAS": "cublaslt"},
    "cublas": {"PROBE_BLAS": "cublas"},
    "lt-workspace-0": {"CUBLASLT_WORKSPACE_SIZE": "0"},
    "cublas-workspace-0": {"CUBLAS_WORKSPACE_CONFIG": ":0:0"},
    "lt-workspace-0-both": {"CUBLASLT_WORKSPACE_SIZE": "0", "CUBLAS_WORKSPACE_CONFIG": ":0:0"},
}


def child() -> dict:
    import torch
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel
    from torch.profiler import ProfilerActivity, profile

    if os.environ.get("PROBE_BLAS"):
        torch.backends.cuda.preferred_blas_library(os.environ["PROBE_BLAS"])
    gen = torch.Generator(device="cuda").manual_seed(0)

    def rand(*shape):
        return torch.randn(*shape, device="cuda", generator=gen).bfloat16()

    x, w, b = rand(10368, 1152), rand(1152, 1152), rand(1152)
    w_up, b_up = rand(4352, 1152), rand(4352)
    dy = rand(816, 1536)
    a816, w_ff = rand(816, 6144), rand(1536, 6144)
    q, k, v = (rand(32, 16, 324, 72) for _ in range(3))

    def sdpa():
        with sdpa_kernel([SDPBackend.CUDNN_ATTENTION]):
            return F.scaled_dot_product_attention(q, k, v)

    def capture(fn, calls=1):
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            for _ in range(3):
                fn()
        torch.cuda.current_stream().wait_stream(stream)
        graph = torch.cuda.CUDAGraph(keep_graph=True)
        with torch.cuda.graph(graph):
            out = [fn() for _ in range(calls)]
        graph.instantiate()
        return graph, out

    def layer():  # a LayerNorm then a GEMM, as in every SigLIP2 block
        return F.linear(F.layer_norm(x, (1152,)), w, b)

    ops = {
        "20 x (layer norm, linear)": layer,
        "mm": lambda: x @ w.t(),
        "linear+bias": lambda: F.linear(x, w, b),
        "gelu epilogue": lambda: torch._addmm_activation(b_up, x, w_up.t(), use_gelu=True),
        "dgrad [816,1536]x[1536,6144]": lambda: dy @ w_ff,
        "wgrad [1536,816]x[816,6144]": lambda: dy.t() @ a816,
        "sdpa cudnn": sdpa,
    }
    out = {}
    for name, fn in ops.items():
        try:
            graph, outputs = capture(fn, calls=20)
            graph.replay()
            torch.cuda.synchronize()
            first = [o.clone() for o in outputs]
            graph.replay()  # the same inputs again: the same bits
            torch.cuda.synchronize()
            same = all(torch.equal(a, o) for a, o in zip(first, outputs))
            reference = fn()
            torch.cuda.synchronize()
            eager_equal = torch.equal(reference, outputs[-1])
            with profile(activities=[ProfilerActivity.CUDA]) as prof:
                for _ in range(4):
                    graph.replay()
                torch.cuda.synchronize()
            names = [e.name for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
            memsets = sum("memset" in n.lower() for n in names) / 4
            kernels = sorted({n[:70] for n in names if "memset" not in n.lower()})
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            for _ in range(5):
                graph.replay()
            end.record()
            end.synchronize()
            out[name] = {"memsets_per_call": memsets / 20, "ms": round(start.elapsed_time(end) / 100, 4),
                         "replays_equal": same,
                         "equal_to_eager": eager_equal, "kernels": kernels}  # fmt: skip
        except Exception as err:  # a setting may not support a form: say so and go on
            out[name] = {"error": repr(err)[:200]}
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--json")
    p.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.child:
        print(json.dumps(child()))
        return
    results = {}
    for name, env in SETTINGS.items():
        run = subprocess.run([sys.executable, __file__, "--child"], env={**os.environ, **env},
                             capture_output=True, text=True)  # fmt: skip
        last = run.stdout.strip().splitlines()[-1:] or [""]
        try:
            results[name] = json.loads(last[0])
        except json.JSONDecodeError:
            results[name] = {"error": run.stderr[-500:]}
        print(name)
        for op, found in results[name].items():
            print(f"  {op:32s} {json.dumps(found)[:300]}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
