"""Step time of a DiT-sized transformer stack trained with vla_graph in eager, per_microbatch and
full_iteration modes.

Default shape: 32 blocks, width 1536 (32 heads x 48), 51 tokens, batch 16 per microbatch, 2 microbatches per
iteration, cross-attention on even blocks to 200 context tokens of width 2048, self-attention on odd
blocks, AdaLN (timestep scale/shift) before attention, GELU(tanh) MLP x4, dropout 0.2, bf16 weights,
fused AdamW outside the graph. Random time and noise are drawn eagerly into static buffers.

    PYTHONPATH=$(ls -d $PWD/packages/*/src | tr '\\n' ':') python benchmarks/graph_step.py --json benchmarks/results/graph_step_h200.json

Reports per mode: step time (the GraphedStep call: all microbatches' forward+backward), optimizer time,
iteration time, speedup over eager, first-call time (warmup + check + capture), peak memory. A tiny CPU run
(`--device cpu --layers 2 --width 64 --heads 4 --context-width 32 --batch 2`) checks the script itself."""

from __future__ import annotations

import argparse
import datetime
import json
import math
import statistics
import time
from pathlib import Path

import torch
import torch.nn.functional as F
import vla_graph
from torch import nn


class Attention(nn.Module):
    def __init__(self, width: int, heads: int, kv_width: int, dropout: float) -> None:
        super().__init__()
        self.heads = heads
        self.q = nn.Linear(width, width)
        self.k = nn.Linear(kv_width, width)
        self.v = nn.Linear(kv_width, width)
        self.out = nn.Linear(width, width)
        self.drop = nn.Dropout(dropout)

    def forward(self, x: torch.Tensor, source: torch.Tensor) -> torch.Tensor:
        b, n, d = x.shape

        def split(t: torch.Tensor) -> torch.Tensor:
            return t.view(b, -1, self.heads, d // self.heads).transpose(1, 2)

        attended = F.scaled_dot_product_attention(
            split(self.q(x)), split(self.k(source)), split(self.v(source))
        )
        return self.drop(self.out(attended.transpose(1, 2).reshape(b, n, d)))


class Block(nn.Module):
    """AdaLN (scale, shift from the time embedding) -> attention -> residual -> LayerNorm -> MLP -> residual."""

    def __init__(self, width: int, heads: int, context_width: int, cross: bool, dropout: float) -> None:
        super().__init__()
        self.cross = cross
        self.norm1 = nn.LayerNorm(width, elementwise_affine=False, eps=1e-5)
        self.modulation = nn.Linear(width, 2 * width)
        self.attn = Attention(width, heads, context_width if cross else width, dropout)
        self.norm3 = nn.LayerNorm(width, elementwise_affine=False, eps=1e-5)
        self.mlp = nn.Sequential(
            nn.Linear(width, 4 * width),
            nn.GELU(approximate="tanh"),
            nn.Dropout(dropout),
            nn.Linear(4 * width, width),
            nn.Dropout(dropout),
        )

    def forward(self, x: torch.Tensor, temb: torch.Tensor, context: torch.Tensor) -> torch.Tensor:
        scale, shift = self.modulation(F.silu(temb)).chunk(2, dim=-1)
        h = self.norm1(x) * (1 + scale[:, None]) + shift[:, None]
        x = x + self.attn(h, context if self.cross else h)
        return x + self.mlp(self.norm3(x))


class BlockStack(nn.Module):
    def __init__(self, args: argparse.Namespace) -> None:
        super().__init__()
        w = args.width
        self.time = nn.Sequential(nn.Linear(256, w), nn.SiLU(), nn.Linear(w, w))
        self.blocks = nn.ModuleList(
            Block(w, args.heads, args.context_width, cross=i % 2 == 0, dropout=args.dropout)
            for i in range(args.layers)
        )
        self.norm_out = nn.LayerNorm(w, elementwise_affine=False, eps=1e-6)
        self.modulation_out = nn.Linear(w, 2 * w)
        self.proj_out = nn.Linear(w, w)

    def loss(self, batch: dict) -> torch.Tensor:
        """Flow matching in token space with pre-drawn `t` [B] and `noise` [B, T, D]."""
        tokens, t, noise = batch["tokens"], batch["t"], batch["noise"]
        x = (1 - t)[:, None, None] * noise + t[:, None, None] * tokens
        half = 128
        freqs = torch.exp(-math.log(1e4) * torch.arange(half, device=t.device, dtype=torch.float32) / half)
        angles = (t.float() * 1000)[:, None] * freqs
        temb = self.time(torch.cat([angles.cos(), angles.sin()], dim=-1).to(tokens.dtype))
        for block in self.blocks:
            x = block(x, temb, batch["context"])
        shift, scale = self.modulation_out(F.silu(temb)).chunk(2, dim=-1)
        x = self.norm_out(x) * (1 + scale[:, None]) + shift[:, None]
        error = (self.proj_out(x).float() - (tokens - noise).float()) ** 2
        return vla_graph.masked_mean(error, batch["valid"])


def make_data(args: argparse.Namespace, device: torch.device, dtype: torch.dtype) -> list[list[dict]]:
    """A few iterations of fixed-shape microbatches, already on the device (cycled during timing)."""
    gen = torch.Generator(device=device).manual_seed(0)
    shape = (args.batch, args.tokens, args.width)
    data = []
    for _ in range(4):
        group = []
        for _ in range(args.microbatches):
            lengths = torch.randint(
                args.tokens // 2, args.tokens + 1, (args.batch,), device=device, generator=gen
            )
            group.append(
                {
                    "tokens": torch.randn(shape, device=device, generator=gen).to(dtype),
                    "context": torch.randn(
                        args.batch, args.context, args.context_width, device=device, generator=gen
                    ).to(dtype),
                    "valid": torch.arange(args.tokens, device=device)[None, :] < lengths[:, None],
                }
            )
        data.append(group)
    return data


def run_mode(mode: str, args: argparse.Namespace, device: torch.device, dtype: torch.dtype) -> dict:
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    if device.type == "cuda":
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
    torch.manual_seed(0)
    with torch.device(device):
        model = BlockStack(args).to(dtype)
    data = make_data(args, device, dtype)
    draws = vla_graph.RandomDraws(
        {
            "t": vla_graph.RandomSpec(shape=(args.batch,), distribution="uniform", high=0.999, dtype=dtype),
            "noise": vla_graph.RandomSpec(shape=(args.batch, args.tokens, args.width), dtype=dtype),
        },
        generator=torch.Generator(device=device).manual_seed(1),
    )
    count = args.microbatches

    def step_fn(batch: dict) -> torch.Tensor:
        loss = model.loss(batch)
        (loss / count).backward()
        return loss

    config = vla_graph.GraphConfig(mode=mode, warmup_iters=args.warmup, check=not args.no_check)
    step = vla_graph.GraphedStep(step_fn, params=model.parameters(), config=config, draw=draws)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-5, fused=device.type == "cuda")
    sync()
    started = time.perf_counter()
    step(data[0])
    sync()
    first_call = time.perf_counter() - started
    opt.step()
    step_ms, opt_ms, losses = [], [], []
    for i in range(args.iters + 2):
        sync()
        t0 = time.perf_counter()
        out = step(data[i % len(data)])
        sync()
        t1 = time.perf_counter()
        opt.step()
        opt.zero_grad(set_to_none=True)
        sync()
        t2 = time.perf_counter()
        if i >= 2:  # two more untimed iterations settle allocator and clocks
            step_ms.append((t1 - t0) * 1e3)
            opt_ms.append((t2 - t1) * 1e3)
            losses.append(float(torch.stack(out).mean()))
    peak = torch.cuda.max_memory_allocated() / 2**30 if device.type == "cuda" else float("nan")
    reserved = torch.cuda.memory_reserved() / 2**30 if device.type == "cuda" else float("nan")
    result = {
        "mode": mode,
        "backend": step.report.backend,
        "step_ms": statistics.median(step_ms),
        "optimizer_ms": statistics.median(opt_ms),
        "iteration_ms": statistics.median(s + o for s, o in zip(step_ms, opt_ms)),
        "first_call_s": first_call,
        "capture_s": step.report.capture_seconds,
        "graphs": step.report.graphs,
        "peak_allocated_gib": peak,
        "reserved_gib": reserved,
        "parameters": sum(p.numel() for p in model.parameters()),
        "final_loss": losses[-1],
        "fallbacks": step.report.fallbacks,
    }
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--modes", default="eager,per_microbatch,full_iteration")
    parser.add_argument("--layers", type=int, default=32)
    parser.add_argument("--width", type=int, default=1536)
    parser.add_argument("--heads", type=int, default=32)
    parser.add_argument("--tokens", type=int, default=51)
    parser.add_argument("--batch", type=int, default=16, help="samples per microbatch")
    parser.add_argument("--microbatches", type=int, default=2)
    parser.add_argument("--context", type=int, default=200, help="cross-attention context tokens")
    parser.add_argument("--context-width", type=int, default=2048)
    parser.add_argument("--dropout", type=float, default=0.2)
    parser.add_argument("--iters", type=int, default=20, help="timed iterations per mode")
    parser.add_argument("--warmup", type=int, default=3, help="GraphConfig.warmup_iters")
    parser.add_argument("--no-check", action="store_true", help="skip the pre-capture check")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--dtype", choices=["bf16", "fp32"], default=None, help="default: bf16 on cuda")
    parser.add_argument("--json", type=Path, help="write the results here")
    args = parser.parse_args(argv)
    device = torch.device(args.device)
    dtype = {"bf16": torch.bfloat16, "fp32": torch.float32}[
        args.dtype or ("bf16" if device.type == "cuda" else "fp32")
    ]
    started = time.perf_counter()
    results = [run_mode(mode, args, device, dtype) for mode in args.modes.split(",")]
    eager = next((r for r in results if r["mode"] == "eager"), None)
    for r in results:
        r["speedup_step"] = eager["step_ms"] / r["step_ms"] if eager else None
        r["speedup_iteration"] = eager["iteration_ms"] / r["iteration_ms"] if eager else None
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    print(
        f"{name}, torch {torch.__version__}, {results[0]['parameters'] / 1e6:.0f} M parameters, "
        f"{args.microbatches} x {args.batch} samples x {args.tokens} tokens per iteration, {dtype}"
    )
    header = f"{'mode':<16}{'step ms':>9}{'opt ms':>8}{'iter ms':>9}{'speedup':>9}{'iter x':>8}"
    print(header + f"{'1st call s':>11}{'capture s':>10}{'peak GiB':>9}{'graphs':>7}  backend")
    for r in results:
        speed = f"{r['speedup_step']:.2f}x" if eager else "-"
        it_speed = f"{r['speedup_iteration']:.2f}x" if eager else "-"
        print(
            f"{r['mode']:<16}{r['step_ms']:>9.2f}{r['optimizer_ms']:>8.2f}{r['iteration_ms']:>9.2f}{speed:>9}"
            f"{it_speed:>8}{r['first_call_s']:>11.2f}{r['capture_s']:>10.2f}{r['peak_allocated_gib']:>9.2f}"
            f"{r['graphs']:>7}  {r['backend']}"
        )
    total = time.perf_counter() - started
    print(f"total {total:.1f} s; step = GraphedStep call (all microbatches' forward+backward), median")
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        payload = {
            "benchmark": "graph_step",
            "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "device": name,
            "torch": torch.__version__,
            "dtype": str(dtype),
            "config": {k: v for k, v in vars(args).items() if k != "json"},
            "results": results,
            "total_seconds": total,
        }
        args.json.write_text(json.dumps(payload, indent=2) + "\n")
        print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
