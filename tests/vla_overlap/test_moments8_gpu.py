"""The 8-bit moment kernel on CUDA (`pytest tests/vla_overlap/test_moments8_gpu.py -m gpu`): bit for bit its torch
form run on the same GPU (both round every operation as IEEE fp32, in the same order, no fused multiply-adds;
the torch form takes its square roots through float64, correctly rounded as the kernel's sqrt_rn), and the same
bits when captured in a CUDA graph and replayed."""

from __future__ import annotations

import pytest
import torch

pytestmark = pytest.mark.gpu


def _bucket(length: int, runs, remainders: bool, seed: int = 0) -> dict:
    from vla_overlap._flat_adamw import plan_blocks
    from vla_overlap._moments8 import allocate, encode_moment_
    from vla_overlap._remainders import encode_

    blocks, align = plan_blocks(runs, length)
    assert align == 64
    gaps = torch.ones(length, dtype=torch.bool, device="cuda")
    for start, end, _ in runs:
        gaps[start:end] = False
    g = torch.Generator(device="cuda").manual_seed(seed)
    scale = 10 ** (-8 * torch.rand(length, generator=g, device="cuda"))  # many magnitudes per block
    flat = {"master": torch.randn(length, generator=g, device="cuda") * 0.05, "runs": runs}
    flat["grad"] = (torch.randn(length, generator=g, device="cuda") * scale).bfloat16()
    m = torch.randn(length, generator=g, device="cuda") * scale * 0.1
    v = torch.rand(length, generator=g, device="cuda") * scale**2 * 0.01
    for t in (flat["master"], flat["grad"], m, v):
        t[gaps] = 0  # the layout's padding
    allocate(flat)
    encode_moment_(flat, "exp_avg", slice(0, length), m)
    encode_moment_(flat, "exp_avg_sq", slice(0, length), v)
    flat["blocks"] = torch.tensor(blocks, device="cuda")
    flat["out"] = flat["master"].bfloat16()
    flat["rem"] = None
    if remainders:
        flat["rem"] = torch.empty(length, dtype=torch.int16, device="cuda")
        encode_(flat["master"], flat["out"], flat["rem"])
    return flat


KEYS = ("master", "out", "rem", "exp_avg", "exp_avg_sq", "exp_avg_scale", "exp_avg_sq_scale")
TABLE = [[1 - 1e-3 * 0.1, 0.9, 0.999, 1e-8, 1e-3 / 0.1, (1 - 0.999) ** 0.5, 0, 0],
         [1.0, 0.8, 0.99, 1e-6, 2e-3 / 0.2, (1 - 0.99) ** 0.5, 0, 0]]  # fmt: skip


@pytest.mark.parametrize("remainders", [False, True], ids=["fp32-masters", "remainders"])
@pytest.mark.parametrize("with_idle", [False, True], ids=["all-stepped", "idle-blocks"])
def test_the_8bit_kernel_gives_the_bits_of_its_torch_form(remainders: bool, with_idle: bool) -> None:
    """Three steps from the same state: runs of two table rows (one of many blocks), padding between them,
    clipping, idle blocks, masters kept or as remainders."""
    from vla_overlap._flat_adamw_steps import torch_step, triton_step

    length = (1 << 20) + 3 * 1024
    runs = [(0, 1 << 19, 0), ((1 << 19) + 64, (1 << 20) - 100, 1), ((1 << 20) + 1024, length - 64, 0)]
    ours, ref = _bucket(length, runs, remainders), _bucket(length, runs, remainders)
    idle = None
    if with_idle:
        idle = torch.arange(len(ours["blocks"]), device="cuda") % 5 == 2
        for flat in (ours, ref):
            for (start, size, _), skip in zip(flat["blocks"].tolist(), idle.tolist()):
                if skip:
                    for key in ("grad", "exp_avg", "exp_avg_sq"):
                        flat[key][start : start + size] = 0
                    for key in ("exp_avg_scale", "exp_avg_sq_scale"):
                        flat[key][start // 64 : (start + size) // 64] = 0
    table, coef = torch.tensor(TABLE, device="cuda"), torch.tensor(0.5, device="cuda")
    before = ours["exp_avg"].clone()
    for _ in range(3):
        triton_step(ours, table, coef, idle)
        torch_step(ref, table, coef, idle)
    for key in KEYS:
        if ours[key] is not None:
            assert torch.equal(ours[key], ref[key]), key
    assert not torch.equal(ours["exp_avg"], before)
    assert int(ours["exp_avg_sq"].ne(0).sum()) > length // 2


def test_the_8bit_kernel_is_capturable_in_a_cuda_graph() -> None:
    """No host synchronization and no allocation in the step: captured once, replayed three times, the same
    bits as three eager steps."""
    from vla_overlap._flat_adamw_steps import triton_step

    length = 1 << 20
    runs = [(0, length // 2, 0), (length // 2, length - 64, 1)]
    eager, graphed = _bucket(length, runs, True), _bucket(length, runs, True)
    table, coef = torch.tensor(TABLE, device="cuda"), torch.tensor(0.5, device="cuda")
    start = {key: graphed[key].clone() for key in KEYS}
    triton_step(graphed, table, coef, None)  # compiles the kernel and makes the level tables
    for key in KEYS:
        graphed[key].copy_(start[key])
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):  # on torch's capture stream
        triton_step(graphed, table, coef, None)
    for _ in range(3):
        graph.replay()
        triton_step(eager, table, coef, None)
    torch.cuda.synchronize()
    for key in KEYS:
        assert torch.equal(graphed[key], eager[key]), key
