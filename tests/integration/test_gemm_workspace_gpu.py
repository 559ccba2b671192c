"""`optimizations.gemm_workspace` on the GPU: a graphed run has cuBLAS without a workspace, so its GEMMs need
no zeroed counter (no memset before each kernel in a graph). Each run is a fresh process: torch 2.11
reads the setting once, at the process's first cuBLAS call."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

pytestmark = pytest.mark.gpu

# During the run (its first step's callback), a SigLIP2-sized GEMM, which cuBLAS's dynamic scheduler serves
# with its default workspace, is captured in a graph and replayed under the profiler: the memsets per replay.
_SCRIPT = textwrap.dedent(
    """
    import sys
    import torch
    import gr00t_train._run as run
    from gr00t_train.cli import main

    found = []

    def memsets_of_a_graphed_gemm():
        x = torch.randn(10368, 1152, device="cuda", dtype=torch.bfloat16)
        w = torch.randn(1152, 1152, device="cuda", dtype=torch.bfloat16)
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            x @ w.t()
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            x @ w.t()
        graph.replay()
        torch.cuda.synchronize()
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
            graph.replay()
            torch.cuda.synchronize()
        names = [e.name for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
        return sum("memset" in name.lower() for name in names), len(names)

    fit = run._fit

    def fit_and_check(trainer, cfg, rank):
        trainer.step_callback = lambda: found or found.append(memsets_of_a_graphed_gemm())
        return fit(trainer, cfg, rank)

    run._fit = fit_and_check
    main(sys.argv[1:])
    print("MEMSETS", *found[0])
    """
)


def _memsets_during_run(dataset, tmp_path, train_args, *sets: str) -> int:
    args = train_args(dataset, tmp_path, "device=cuda", "steps=3", "precision=bf16", "optimizations.compile=off",
                      "optimizations.comm=overlap", "optimizations.graph=per_microbatch", *sets)  # fmt: skip
    env = {k: v for k, v in os.environ.items() if k != "CUBLAS_WORKSPACE_CONFIG"}
    proc = subprocess.run([sys.executable, "-c", _SCRIPT, *args], env=env, capture_output=True, text=True,
                          timeout=300)  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    line = next(line for line in proc.stdout.splitlines() if line.startswith("MEMSETS"))
    _, memsets, kernels = line.split()
    assert int(kernels) >= 1
    return int(memsets)


def test_a_graphed_run_has_cublas_gemms_without_memsets(dataset, tmp_path, train_args) -> None:
    assert _memsets_during_run(dataset, tmp_path / "zero", train_args) == 0
    # The control: cuBLAS's default workspace serves the same GEMM with its dynamic scheduler and a memset.
    assert (
        _memsets_during_run(dataset, tmp_path / "default", train_args, "optimizations.gemm_workspace=default")
        == 1
    )
