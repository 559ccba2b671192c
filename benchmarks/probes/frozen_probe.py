"""The frozen prefix of an n1.6-3b step (SigLIP2 tower, connector, frozen Qwen3 layers) under its GEMM options.

    PYTHONPATH=<the packages' src folders> python benchmarks/probes/frozen_probe.py [--json OUT] [--variants ...]

Prints (1) single GEMMs of the prefix's shapes in bf16 and fp8 with rowwise scales (with and without quantizing
the activation); (2) whether torch.mm writes fp32 from bf16 (weight-gradient GEMMs into fp32 buffers); (2b) the
SigLIP2 up-projection with its GELU as a separate pass and in the GEMM's epilogue (graph-timed); (3) the
whole prefix (compiled blocks, one CUDA graph, no grad, batch 16, two 252x252 cameras) per variant, its time and
its difference from the plain bf16 prefix, and the plain prefix's top ops by GPU time.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F
from gr00t_model import GR00TN16, GR00TConfig, make_dummy_batch
from gr00t_model._frozen_linear import FP8, FP8_MAX, FrozenLinear
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the shared helpers in benchmarks/
from _cuda_timing import capture, cuda_graph_ms, cuda_ms  # noqa: E402

SHAPES = {  # name: (M, K, N) of one GEMM of the prefix at batch 16, two cameras
    "siglip qkvo": (10368, 1152, 1152),
    "siglip fc1": (10368, 1152, 4304),
    "siglip fc2": (10368, 4304, 1152),
    "qwen3 q/o": (3264, 2048, 2048),
    "qwen3 k/v": (3264, 2048, 1024),
    "qwen3 gate/up": (3264, 2048, 6144),
    "qwen3 down": (3264, 6144, 2048),
}


def gemms() -> list[dict]:
    return [gemm_row(name, *mkn) for name, mkn in SHAPES.items()]


def gemm_row(name: str, m: int, k: int, n: int) -> dict:
    x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
    lin = nn.Linear(k, n, device="cuda", dtype=torch.bfloat16).requires_grad_(False)
    flop = 2 * m * k * n
    row = {"gemm": name, "mkn": [m, k, n], "bf16_ms": cuda_ms(lambda: lin(x))}
    fp8 = FrozenLinear(lin, fp8=True)
    row["fp8_with_quant_ms"] = cuda_ms(lambda: fp8(x))
    rows_f = x.float()
    scale = rows_f.abs().amax(1, keepdim=True) / FP8_MAX
    xq = (rows_f / scale).to(FP8)
    row["fp8_gemm_ms"] = cuda_ms(
        lambda: torch._scaled_mm(xq, fp8.fp8_weight.t(), scale_a=scale, scale_b=fp8.fp8_scale,
                                 bias=lin.bias, out_dtype=torch.bfloat16)
    )  # fmt: skip
    for key in ("bf16", "fp8_gemm"):
        row[f"{key}_tflops"] = flop / row[f"{key}_ms"] / 1e9
    print(json.dumps({k: round(v, 3) if isinstance(v, float) else v for k, v in row.items()}), flush=True)
    return row


def unwrap(model: nn.Module) -> None:
    """Back to plain nn.Linear everywhere (the probe reuses one model for every variant)."""
    for name, child in list(model.named_modules()):
        if isinstance(child, FrozenLinear):
            parent_name, _, attr = name.rpartition(".")
            plain = nn.Linear(
                child.in_features, child.out_features, bias=child.bias is not None, device="meta"
            )
            plain.weight, plain.bias = child.weight, child.bias
            setattr(model.get_submodule(parent_name), attr, plain)


def prefix_variants(names: list[str]) -> list[dict]:
    config = GR00TConfig.preset("n1.6-3b", image_size=(252, 252), trainable_dtype="bfloat16")
    torch.manual_seed(0)
    with torch.device("cuda"):
        model = GR00TN16(config).train()
    batch = make_dummy_batch(config, 16, num_images=2, device=torch.device("cuda"))
    rows, reference = [], None
    for name in names:
        torch._dynamo.reset()
        model.uncompile_blocks()
        unwrap(model)
        done = model.prepare_frozen_prefix(fp8=name == "fp8") if name != "bf16" else {}
        model.compile_blocks()
        t0 = time.perf_counter()
        with torch.no_grad():
            graph, out = capture(lambda: model.frozen_prefix(batch))
        start_s = time.perf_counter() - t0
        ms = cuda_ms(graph.replay)
        hidden = out.hidden.float().clone()
        row = {"variant": name, **done, "prefix_ms": ms, "start_s": start_s}
        if reference is None:
            reference = hidden
        else:
            diff = (hidden - reference).abs()
            row["max_abs_diff"] = diff.max().item()
            row["rel_rms_diff"] = (diff.square().mean().sqrt() / reference.square().mean().sqrt()).item()
        print(json.dumps(row), flush=True)
        rows.append(row)
        del graph, out
        rows[-1]["top_kernels"] = top_kernels(model, batch, 12)
    return rows


def top_kernels(model: GR00TN16, batch, count: int = 25) -> list:
    from torch.profiler import ProfilerActivity, profile

    kinds = [ProfilerActivity.CPU, ProfilerActivity.CUDA]
    with torch.no_grad(), profile(activities=kinds, record_shapes=True) as prof:
        model.frozen_prefix(batch)
        torch.cuda.synchronize()
    table = sorted(
        ((e.key, str(e.input_shapes)[:160], e.self_device_time_total / 1e3, e.count)
         for e in prof.key_averages(group_by_input_shape=True)),
        key=lambda r: -r[2],
    )[:count]  # fmt: skip
    for key, shapes, ms, calls in table:
        print(f"  {ms:7.3f} ms {calls:4d}x  {key[:100]}  {shapes}")
    return table


def out_dtype_mm() -> dict:
    """Whether torch.mm writes fp32 from bf16 inputs (weight-gradient GEMMs straight into fp32 buffers)."""
    a = torch.randn(1536, 816, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(816, 6144, device="cuda", dtype=torch.bfloat16)
    row = {"bf16_then_cast_ms": cuda_ms(lambda: torch.mm(a, b).float())}
    try:
        row["out_dtype_ms"] = cuda_ms(lambda: torch.mm(a, b, out_dtype=torch.float32))
        acc = torch.zeros(1536, 6144, device="cuda")
        row["addmm_out_dtype_ms"] = cuda_ms(lambda: torch.addmm(acc, a, b, out_dtype=torch.float32, out=acc))
    except Exception as error:  # noqa: BLE001 - report what this torch lacks
        row["error"] = f"{type(error).__name__}: {error}"[:300]
    print(json.dumps(row), flush=True)
    return row


def gelu_epilogue() -> dict:
    """SigLIP2's padded up-projection at batch 16, two cameras: GEMM then a separate tanh GELU, GELU in the
    GEMM's epilogue (FrozenLinear(gelu=True)), and the GEMM alone; ms per call, 20 calls in a CUDA graph."""
    x = torch.randn(10368, 1152, device="cuda", dtype=torch.bfloat16)
    lin = nn.Linear(1152, 4304, device="cuda", dtype=torch.bfloat16).requires_grad_(False)
    padded, fused = FrozenLinear(lin, pad_out=48), FrozenLinear(lin, pad_out=48, gelu=True)
    row = {
        "gemm_then_gelu_ms": cuda_graph_ms(lambda: F.gelu(padded(x), approximate="tanh")),
        "gelu_in_epilogue_ms": cuda_graph_ms(lambda: fused(x)),
        "gemm_alone_ms": cuda_graph_ms(lambda: padded(x)),
    }
    print(json.dumps(row), flush=True)
    return row


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--json")
    p.add_argument(
        "--variants",
        default="bf16,pad,fp8",
        help="bf16: as built; pad: prepare_frozen_prefix(); fp8: prepare_frozen_prefix(fp8=True)",
    )
    p.add_argument("--sections", default="gemms,out_dtype_mm,gelu_epilogue,prefix")
    a = p.parse_args()
    torch.backends.cuda.matmul.allow_tf32 = True
    result = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "date": time.strftime("%F")}
    for key, fn in (("gemms", gemms), ("out_dtype_mm", out_dtype_mm), ("gelu_epilogue", gelu_epilogue),
                    ("prefix", lambda: prefix_variants(a.variants.split(",")))):  # fmt: skip
        if key not in a.sections.split(","):
            continue
        try:
            result[key] = fn()
        except Exception as error:  # noqa: BLE001 - keep the other sections
            print(f"{key} failed: {type(error).__name__}: {error}", flush=True)
            result[key] = {"error": f"{type(error).__name__}: {error}"[:500]}
    if a.json:
        with open(a.json, "w") as f:
            json.dump(result, f, indent=1, default=str)


if __name__ == "__main__":
    main()
