"""Can the optimizer update run beside the frozen prefix instead of taking turns with it? (issue 12)

    PYTHONPATH=<the packages' src folders> python benchmarks/sm_split_probe.py [--json OUT]

The update (a memory-bound pass over 1.62 B fp32 parameters, ~12 ms) and the frozen prefix (GEMM-bound, ~30 ms)
should overlap well, but a full-grid update kernel fills every SM, and cuBLAS's Hopper GEMM blocks need a whole
SM: the streams take turns. This probe splits the SMs instead: the update kernel runs persistent on P programs,
the prefix's GEMMs are captured with cuBLAS's SM-count target lowered by C (torch's sm carveout). It prints the
prefix alone per C, the update alone per P, and both at once (each stream's finish time).
"""

from __future__ import annotations

import argparse
import json
import time

import torch
import triton
import triton.language as tl
from _cuda_timing import capture, cuda_ms
from _probe_model import full_model_and_batch

N = 1_620_000_000
BLOCK = 1024


@triton.jit
def adamw_store(p_ptr, m_ptr, v_ptr, out_ptr, offsets, p, g, m, v, EVICT: tl.constexpr = ""):
    """An AdamW step's arithmetic and bytes (fixed hyperparameters) on loaded values, stored at `offsets`."""
    g = g.to(tl.float32)
    p = p * 0.9999
    m = m + 0.1 * (g - m)
    v = v * 0.999 + 0.001 * g * g
    p = p - tl.div_rn(1e-4 * m, tl.div_rn(tl.sqrt_rn(v), 0.5) + 1e-8)
    tl.store(p_ptr + offsets, p, eviction_policy=EVICT)
    tl.store(m_ptr + offsets, m, eviction_policy=EVICT)
    tl.store(v_ptr + offsets, v, eviction_policy=EVICT)
    tl.store(out_ptr + offsets, p.to(tl.bfloat16), eviction_policy=EVICT)


@triton.jit
def adamw_persistent(p_ptr, g_ptr, m_ptr, v_ptr, out_ptr, n_blocks, BLOCK: tl.constexpr):  # fmt: skip
    for b in range(tl.program_id(0), n_blocks, tl.num_programs(0)):
        o = b.to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
        p, g, m, v = tl.load(p_ptr + o), tl.load(g_ptr + o), tl.load(m_ptr + o), tl.load(v_ptr + o)
        adamw_store(p_ptr, m_ptr, v_ptr, out_ptr, o, p, g, m, v)


@triton.jit
def sumsq_persistent(g_ptr, partial_ptr, n_blocks, BLOCK: tl.constexpr):
    acc = tl.zeros((BLOCK,), dtype=tl.float32)
    for b in range(tl.program_id(0), n_blocks, tl.num_programs(0)):
        g = tl.load(g_ptr + b.to(tl.int64) * BLOCK + tl.arange(0, BLOCK))
        acc += g * g
    tl.store(partial_ptr + tl.program_id(0), tl.sum(acc))


class Update:
    def __init__(self) -> None:
        self.p, self.g, self.m, self.v = (torch.rand(N, device="cuda") for _ in range(4))
        self.out = torch.empty(N, device="cuda", dtype=torch.bfloat16)
        self.partial = torch.zeros(4096, device="cuda")
        self.blocks = N // BLOCK

    def run(self, programs: int, warps: int = 4, norm: bool = True) -> None:
        if norm:
            sumsq_persistent[(programs,)](self.g, self.partial, self.blocks, BLOCK=BLOCK, num_warps=warps)
        adamw_persistent[(programs,)](
            self.p, self.g, self.m, self.v, self.out, self.blocks, BLOCK=BLOCK, num_warps=warps
        )


def prefix_graphs(carveouts: list[int]):
    model, batch = full_model_and_batch()
    graphs = {}
    with torch.no_grad():
        for c in carveouts:
            torch._C._set_sm_carveout_experimental(c or None)
            graphs[c], _ = capture(lambda: model.frozen_prefix(batch), warmup=2)
        torch._C._set_sm_carveout_experimental(None)
    return graphs


def together(graph, update: Update, programs: int, warps: int) -> dict:
    """Both at once: the update on a side stream, the prefix on the current one; each one's finish (ms)."""
    main = torch.cuda.current_stream()
    side = torch.cuda.Stream()
    rows = []
    for _ in range(4):
        t0 = torch.cuda.Event(enable_timing=True)
        t_main, t_side = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        torch.cuda.synchronize()
        t0.record(main)
        side.wait_stream(main)
        with torch.cuda.stream(side):
            update.run(programs, warps)
        t_side.record(side)
        graph.replay()
        t_main.record(main)
        torch.cuda.synchronize()
        rows.append((t0.elapsed_time(t_main), t0.elapsed_time(t_side)))
    rows = rows[1:]
    prefix = sum(r[0] for r in rows) / len(rows)
    upd = sum(r[1] for r in rows) / len(rows)
    return {"prefix_ms": prefix, "update_ms": upd, "both_ms": max(prefix, upd)}


# ----------------------------------------------------------------------------- second pass (--split2)
@triton.jit
def adamw_range(p_ptr, g_ptr, m_ptr, v_ptr, out_ptr, per_program, BLOCK: tl.constexpr, STAGES: tl.constexpr,
                PREFETCH: tl.constexpr, EVICT: tl.constexpr = ""):  # fmt: skip
    """Each program walks its own contiguous range (no descriptor loads); STAGES > 1 asks Triton's pipeliner
    for loads in flight across iterations, PREFETCH carries the next block's loads through the loop."""
    start = tl.program_id(0).to(tl.int64) * per_program
    lanes = tl.arange(0, BLOCK)
    if PREFETCH:
        o = start + lanes
        p, g, m, v = tl.load(p_ptr + o), tl.load(g_ptr + o), tl.load(m_ptr + o), tl.load(v_ptr + o)
        for s in range(0, per_program, BLOCK):
            o = start + s + lanes
            nxt = o + BLOCK
            live = (s + BLOCK + lanes) < per_program
            p2 = tl.load(p_ptr + nxt, mask=live, eviction_policy=EVICT)
            g2 = tl.load(g_ptr + nxt, mask=live, eviction_policy=EVICT)
            m2 = tl.load(m_ptr + nxt, mask=live, eviction_policy=EVICT)
            v2 = tl.load(v_ptr + nxt, mask=live, eviction_policy=EVICT)
            adamw_store(p_ptr, m_ptr, v_ptr, out_ptr, o, p, g, m, v, EVICT)
            p, g, m, v = p2, g2, m2, v2
    else:
        for s in tl.range(0, per_program, BLOCK, num_stages=STAGES):
            o = start + s + lanes
            p, g, m, v = tl.load(p_ptr + o), tl.load(g_ptr + o), tl.load(m_ptr + o), tl.load(v_ptr + o)
            adamw_store(p_ptr, m_ptr, v_ptr, out_ptr, o, p, g, m, v)


@triton.jit
def sumsq_range(g_ptr, partial_ptr, per_program, BLOCK: tl.constexpr, EVICT: tl.constexpr = ""):
    start = tl.program_id(0).to(tl.int64) * per_program
    acc = tl.zeros((BLOCK,), dtype=tl.float32)
    for s in tl.range(0, per_program, BLOCK, num_stages=3):
        g = tl.load(g_ptr + start + s + tl.arange(0, BLOCK), eviction_policy=EVICT).to(tl.float32)
        acc += g * g
    tl.store(partial_ptr + tl.program_id(0), tl.sum(acc))


class RangeUpdate:
    """The real layout's bytes: fp32 master, m, v; bf16 gradient and bf16 working copy (30 bytes/param)."""

    def __init__(self) -> None:
        self.p, self.m, self.v = (torch.rand(N, device="cuda") for _ in range(3))
        self.g = torch.rand(N, device="cuda").to(torch.bfloat16)
        self.out = torch.empty(N, device="cuda", dtype=torch.bfloat16)
        self.partial = torch.zeros(4096, device="cuda")

    def run(
        self, programs: int, block: int, warps: int, mode: str, norm: bool = True, evict: str = ""
    ) -> None:
        per = (N // programs) // 8192 * 8192  # the probe covers all but < programs * 8192 elements
        if norm:
            sumsq_range[(programs,)](self.g, self.partial, per, BLOCK=4096, EVICT=evict, num_warps=8)
        stages = int(mode[1:]) if mode.startswith("s") else 1
        adamw_range[(programs,)](self.p, self.g, self.m, self.v, self.out, per, BLOCK=block, STAGES=stages,
                                 PREFETCH=mode == "prefetch", EVICT=evict, num_warps=warps)  # fmt: skip


def split2(a, result: dict) -> None:
    x = torch.randn(10368, 1152, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(1152, 4352, device="cuda", dtype=torch.bfloat16)
    mm = {}
    for lib in ("cublas", "cublaslt"):
        torch.backends.cuda.preferred_blas_library(lib)
        for c in (0, 33, 66):
            torch._C._set_sm_carveout_experimental(c or None)
            mm[f"{lib}/{c}"] = cuda_ms(lambda: x @ w, 20)
    torch._C._set_sm_carveout_experimental(None)
    torch.backends.cuda.preferred_blas_library("cublas")
    result["mm_ms_by_lib_carveout"] = mm
    print("mm by lib/carveout:", {k: round(v, 4) for k, v in mm.items()}, flush=True)
    up = RangeUpdate()
    alone = {}
    for mode in ("s1", "s3", "prefetch"):
        for block, warps in ((4096, 16), (8192, 16), (8192, 32), (16384, 32)):
            key = f"32p/{mode}/{block}/{warps}w"
            if mode == "s3" and block > 4096:
                continue  # Triton's pipeliner stages these loads through shared memory: too big
            alone[key] = cuda_ms(
                lambda b=block, w=warps, m=mode: up.run(32, b, w, m, norm=False), 3, warmup=1
            )
            print(key, round(alone[key], 2), "ms", round(N * 30 / alone[key] / 1e9, 2), "TB/s", flush=True)
    best = sorted(alone, key=alone.get)[:3]
    for key in best:
        _, mode, block, warps = key.split("/")
        for p in (24, 40, 48, 64, 132):
            k2 = f"{p}p/{mode}/{block}/{warps}"
            alone[k2] = cuda_ms(
                lambda p=p, b=int(block), w=int(warps[:-1]), m=mode: up.run(p, b, w, m), 3, warmup=1
            )
            print(k2, "(with norm)", round(alone[k2], 2), "ms", flush=True)
    result["range_update_alone_ms"] = alone
    mode, block, warps = best[0].split("/")[1:]
    carveouts = [int(c) for c in a.carveouts.split(",")]
    rows = []
    for lib in ("cublaslt", "cublas"):
        torch.backends.cuda.preferred_blas_library(lib)
        graphs = prefix_graphs(carveouts)
        torch.backends.cuda.preferred_blas_library("cublas")
        prefix_alone = {c: cuda_ms(g.replay, 5) for c, g in graphs.items()}
        print(lib, "prefix alone by carveout:", {c: round(v, 2) for c, v in prefix_alone.items()}, flush=True)
        result[f"prefix_alone_ms_{lib}"] = prefix_alone
        for c in carveouts:
            for p in (c, c + 8, c + 16) if c else (32, 48):
                u = _RangeAsUpdate(up, int(block), int(warps[:-1]), mode)
                row = {"lib": lib, "carveout": c, "programs": p, "kernel": best[0].split("/", 1)[1],
                       **together(graphs[c], u, p, 0)}  # fmt: skip
                print(json.dumps({k: round(v, 2) if isinstance(v, float) else v for k, v in row.items()}),
                      flush=True)  # fmt: skip
                rows.append(row)
        del graphs
    result["together_range"] = rows
    print("best:", min(rows, key=lambda r: r["both_ms"]), flush=True)


class _RangeAsUpdate:
    def __init__(self, up, block, warps, mode, evict=""):
        self.up, self.block, self.warps, self.mode, self.evict = up, block, warps, mode, evict

    def run(self, programs, _warps):
        self.up.run(programs, self.block, self.warps, self.mode, evict=self.evict)


# ----------------------------------------------------------------------------- third pass (--split3)
def split3(a, result: dict) -> None:
    """Does the prefix still slow down beside an update on other SMs once the update's loads and stores are
    marked evict-first (so that its 40+ GB stream stops flushing the GEMMs' operand tiles out of L2)?
    The eighth pass's best range kernel (prefetch, 4096-element blocks, 16 warps), cuBLASLt carveouts."""
    up = RangeUpdate()
    alone = {}
    for evict in ("", "evict_first"):
        for p in (16, 24, 32, 48, 132):
            key = f"{p}p/{evict or 'default'}"
            alone[key] = cuda_ms(lambda p=p, e=evict: up.run(p, 4096, 16, "prefetch", evict=e), 3, warmup=1)
            print("update alone (with norm)", key, round(alone[key], 2), "ms", flush=True)
    result["range_update_alone_ms"] = alone
    carveouts = [int(c) for c in a.carveouts.split(",")]
    torch.backends.cuda.preferred_blas_library("cublaslt")
    graphs = prefix_graphs(carveouts)
    torch.backends.cuda.preferred_blas_library("cublas")
    prefix_alone = {c: cuda_ms(g.replay, 5) for c, g in graphs.items()}
    print("prefix alone by carveout:", {c: round(v, 2) for c, v in prefix_alone.items()}, flush=True)
    result["prefix_alone_ms"] = prefix_alone
    rows = []
    for c in carveouts:
        for p in (c, c + 8, c + 16) if c else (16, 32):
            for evict in ("", "evict_first"):
                u = _RangeAsUpdate(up, 4096, 16, "prefetch", evict)
                row = {
                    "carveout": c,
                    "programs": p,
                    "evict": evict or "default",
                    **together(graphs[c], u, p, 0),
                }
                print(json.dumps({k: round(v, 2) if isinstance(v, float) else v for k, v in row.items()}),
                      flush=True)  # fmt: skip
                rows.append(row)
    result["together"] = rows
    print("best:", min(rows, key=lambda r: r["both_ms"]), flush=True)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--json")
    p.add_argument("--carveouts", default="0,8,16,24,32,48")
    p.add_argument("--programs", default="8,16,24,32,48,66,132,264,528")
    p.add_argument("--split2", action="store_true", help="the second pass: range kernels, cublasLt carveout")
    p.add_argument("--split3", action="store_true", help="the third pass: the update's loads evict-first")
    a = p.parse_args()
    torch.backends.cuda.matmul.allow_tf32 = True
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    result = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "date": time.strftime("%F"),
              "sms": sms}  # fmt: skip
    if a.split2 or a.split3:
        (split3 if a.split3 else split2)(a, result)
        if a.json:
            with open(a.json, "w") as f:
                json.dump(result, f, indent=1, default=str)
        return
    # does the carveout reach plain bf16 matmuls?
    x = torch.randn(10368, 1152, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(1152, 4352, device="cuda", dtype=torch.bfloat16)
    mm = {}
    for c in (0, 33, 66):
        torch._C._set_sm_carveout_experimental(c or None)
        mm[c] = cuda_ms(lambda: x @ w, 20)
    torch._C._set_sm_carveout_experimental(None)
    result["mm_ms_by_carveout"] = mm
    print("mm 10368x1152x4352 by carveout:", mm, flush=True)
    carveouts = [int(c) for c in a.carveouts.split(",")]
    programs = [int(c) for c in a.programs.split(",")]
    graphs = prefix_graphs(carveouts)
    result["prefix_alone_ms"] = {c: cuda_ms(g.replay, 5) for c, g in graphs.items()}
    print("prefix alone by carveout:", result["prefix_alone_ms"], flush=True)
    update = Update()
    result["update_alone_ms"] = {}
    for warps in (4, 8):
        for n in programs:
            result["update_alone_ms"][f"{n}x{warps}w"] = cuda_ms(
                lambda n=n, w=warps: update.run(n, w), 5, warmup=1
            )
    full = update.blocks  # today's grid: one program per block
    result["update_alone_ms"]["full"] = cuda_ms(lambda: update.run(full, 4, norm=False), 5, warmup=1)
    print(
        "update alone:",
        json.dumps({k: round(v, 2) for k, v in result["update_alone_ms"].items()}),
        flush=True,
    )
    rows = []
    for c in carveouts:
        for n in programs:
            if c and n > 4 * c * 4:
                continue
            for warps in (4, 8):
                row = {"carveout": c, "programs": n, "warps": warps, **together(graphs[c], update, n, warps)}
                print(json.dumps({k: round(v, 2) if isinstance(v, float) else v for k, v in row.items()}),
                      flush=True)  # fmt: skip
                rows.append(row)
    result["together"] = rows
    best = min(rows, key=lambda r: r["both_ms"])
    print("best:", best, flush=True)
    if a.json:
        with open(a.json, "w") as f:
            json.dump(result, f, indent=1, default=str)


if __name__ == "__main__":
    main()
