"""Every GEMM of one n1.6-3b training step, by shape, timed alone with cuBLAS: how far each runs from the
datasheet peak, and what the step's GEMMs would cost at those rates (the GEMM floor of the step).

    PYTHONPATH=<the packages' src folders> python benchmarks/probes/gemm_shapes.py [--json OUT]

One forward pass (no grad) with hooks on every linear layer records (M, K, N) and whether the layer trains.
Each distinct shape is then timed in bf16, 20 calls captured in one CUDA graph as in the step (timed from
Python, kernels under ~25 us run at the host's launch rate): the forward product, and for trainable layers
the input-gradient (dgrad) and weight-gradient (wgrad) products of the backward, the latter also into an
fp32 output. Rows are grouped by module kind (the layer name without block indices) and printed by their
total ms per step. WHAT_IF times merged GEMMs that could replace groups of small ones.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from collections import defaultdict
from pathlib import Path

import torch
from gr00t_model import GR00TN16, GR00TConfig, make_dummy_batch
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the shared helpers in benchmarks/
from _cuda_timing import cuda_graph_ms  # noqa: E402

PEAK = 989.0  # H100/H200 dense bf16 TFLOP/s (datasheet)
WHAT_IF = {  # (M, K, N, calls) of merged GEMMs that would replace some of the step's small ones
    "DiT self-attention q|k|v in one GEMM": (816, 1536, 4608, 16),
    "DiT cross-attention k|v in one GEMM": (3264, 2048, 3072, 16),
    "DiT AdaLN of all 32 blocks in one GEMM": (16, 1536, 32 * 3072, 1),
}


def record_shapes(model: nn.Module, batch: dict) -> dict:
    """{(kind, M, K, N, trains): calls} over one forward of `batch`."""
    calls: dict = defaultdict(int)
    hooks = []
    for name, module in model.named_modules():
        if isinstance(module, nn.Linear) or type(module).__name__ == "FrozenLinear":
            kind = re.sub(r"\.\d+\.", ".*.", name)
            trains = any(p.requires_grad for p in module.parameters())

            def hook(mod, args, out, kind=kind, trains=trains):
                x = args[0]
                m, k = x.numel() // x.shape[-1], x.shape[-1]
                calls[(kind, m, k, out.shape[-1], trains)] += 1

            hooks.append(module.register_forward_hook(hook))
    with torch.no_grad():
        model(batch)
    for h in hooks:
        h.remove()
    return calls


def time_shape(m: int, k: int, n: int, trains: bool) -> dict:
    bf = dict(device="cuda", dtype=torch.bfloat16)
    x, w, dy = torch.randn(m, k, **bf), torch.randn(n, k, **bf), torch.randn(m, n, **bf)
    row = {"fwd_ms": cuda_graph_ms(lambda: x @ w.t())}
    if trains:
        row["dgrad_ms"] = cuda_graph_ms(lambda: dy @ w)
        row["wgrad_ms"] = cuda_graph_ms(lambda: dy.t() @ x)
        row["wgrad_fp32_out_ms"] = cuda_graph_ms(lambda: torch.mm(dy.t(), x, out_dtype=torch.float32))
    for key in [k_ for k_ in row if k_.endswith("_ms")]:
        row[key.replace("_ms", "_tflops")] = 2 * m * k * n / row[key] / 1e9
    return row


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--preset", default="n1.6-3b")
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--json")
    args = p.parse_args()
    torch.backends.cuda.matmul.allow_tf32 = True
    config = GR00TConfig.preset(args.preset)
    model = GR00TN16(config).cuda().train()
    model.prepare_frozen_prefix()
    batch = make_dummy_batch(config, args.batch, num_images=2, device="cuda", seed=0)
    calls = record_shapes(model, batch)
    del model
    torch.cuda.empty_cache()
    rows, total = [], defaultdict(float)
    for (kind, m, k, n, trains), count in sorted(calls.items()):
        row = {
            "kind": kind,
            "mkn": [m, k, n],
            "trains": trains,
            "calls": count,
            **time_shape(m, k, n, trains),
        }
        row["step_ms"] = count * (row["fwd_ms"] + row.get("dgrad_ms", 0) + row.get("wgrad_ms", 0))
        row["step_at_peak_ms"] = count * 2 * m * k * n * (3 if trains else 1) / PEAK / 1e9
        total["step_ms"] += row["step_ms"]
        total["step_at_peak_ms"] += row["step_at_peak_ms"]
        total["trainable_ms" if trains else "frozen_ms"] += row["step_ms"]
        rows.append(row)
    rows.sort(key=lambda r: -r["step_ms"])
    for r in rows:
        rates = " ".join(f"{k[:-7]} {v:5.0f}" for k, v in r.items() if k.endswith("_tflops"))
        print(f"{r['kind'][:48]:48s} {str(r['mkn']):22s} x{r['calls']:<3d} {r['step_ms']:6.2f} ms  "
              f"(peak {r['step_at_peak_ms']:5.2f})  TFLOP/s: {rates}", flush=True)  # fmt: skip
    print({k: round(v, 2) for k, v in total.items()}, flush=True)
    what_if = []
    for name, (m, k, n, count) in WHAT_IF.items():
        row = {"what_if": name, "mkn": [m, k, n], "calls": count, **time_shape(m, k, n, True)}
        row["step_ms"] = count * (row["fwd_ms"] + row["dgrad_ms"] + row["wgrad_ms"])
        print(f"what if: {name:40s} {str(row['mkn']):22s} x{count:<3d} {row['step_ms']:6.2f} ms", flush=True)
        what_if.append(row)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"device": torch.cuda.get_device_name(), "torch": torch.__version__, "rows": rows,
                       "total": total, "what_if": what_if}, f, indent=1)  # fmt: skip


if __name__ == "__main__":
    main()
