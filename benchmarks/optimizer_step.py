"""The step's memory-bound passes over the trainable weights of n1.6-3b, alone on the GPU: the bf16 -> fp32
gradient copies (torch's mixed-dtype copy vs vla-overlap's cast kernel), the fp32 -> bf16 parameter write-back,
and DistributedAdamW's step (clip + update + write-back) with torch's fused AdamW vs the flat Triton kernel.

Parameters have the model's trainable shapes and dtypes (bf16 working weights), random values; copies are
captured in one CUDA graph per variant (no launch overhead, as in training) and timed by replaying it. Each
row gives ms and the bandwidth reached (bytes the pass must move / time), and whether the fast path equals the
reference bit for bit (copies) or how far it is from it (optimizer: ulps of the bf16 weights after 3 steps).

    PYTHONPATH=$(ls -d $PWD/packages/*/src | tr '\\n' ':') python benchmarks/optimizer_step.py --json out.json
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn


def trainable_shapes(preset: str) -> list[tuple[str, torch.Size, torch.dtype]]:
    from gr00t_model import GR00TN16, GR00TConfig

    config = GR00TConfig.preset(preset, compute_dtype="bfloat16", frozen_dtype="bfloat16", trainable_dtype="bfloat16")
    with torch.device("meta"):
        model = GR00TN16(config)
    return [(n, p.shape, p.dtype) for n, p in model.named_parameters() if p.requires_grad]


class Weights(nn.Module):
    def __init__(self, shapes, device) -> None:
        super().__init__()
        self.names = [n for n, _, _ in shapes]
        self.params = nn.ParameterList(
            nn.Parameter(torch.randn(s, device=device).mul_(0.02).to(d)) for _, s, d in shapes
        )


def timed_graph(fn, reps: int) -> float:
    """ms per call of `fn`, captured in a CUDA graph and replayed."""
    fn()  # warm up (Triton compiles here)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    graph.replay()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(reps):
        graph.replay()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) / reps


def copies(shapes, reps: int) -> list[dict]:
    from vla_overlap._cast_kernel import cast_into

    grads = [torch.randn(s, device="cuda", dtype=torch.bfloat16) for _, s, _ in shapes]
    numel = sum(g.numel() for g in grads)
    flat = torch.empty(numel, device="cuda")
    views, offset = [], 0
    for g in grads:
        views.append(flat[offset : offset + g.numel()].view(g.shape))
        offset += g.numel()
    rows = []
    for what, nbytes in (("copy", 6), ("add", 10)):
        results = {}
        for name, op in (
            ("torch", (lambda t, g: t.copy_(g)) if what == "copy" else (lambda t, g: t.add_(g))),
            ("cast kernel", lambda t, g, a=what == "add": cast_into(t, g, add=a)),
        ):
            flat.fill_(1.0)
            ms = timed_graph(lambda op=op: [op(t, g) for t, g in zip(views, grads)], reps)
            flat.fill_(1.0)
            for t, g in zip(views, grads):
                op(t, g)
            results[name] = flat.clone()
            rows.append({"pass": f"bf16 grad -> fp32 buffer ({what}, {len(grads)} tensors)", "variant": name,
                         "ms": round(ms, 3), "GB/s": round(numel * nbytes / ms / 1e6)})  # fmt: skip
        rows[-1]["bitwise_equal_to_torch"] = bool(torch.equal(results["torch"], results["cast kernel"]))
    masters = flat.normal_()
    out = {}
    for name, op in (("torch", lambda: views16.copy_(masters)), ("cast kernel", lambda: cast_into(views16, masters))):
        views16 = torch.empty(numel, device="cuda", dtype=torch.bfloat16)
        ms = timed_graph(op, reps)
        out[name] = views16
        rows.append({"pass": "fp32 master -> bf16 weights (one flat copy)", "variant": name, "ms": round(ms, 3),
                     "GB/s": round(numel * 6 / ms / 1e6)})  # fmt: skip
    rows[-1]["bitwise_equal_to_torch"] = bool(torch.equal(out["torch"], out["cast kernel"]))
    return rows


def optimizer(shapes, reps: int) -> list[dict]:
    import vla_overlap

    rows, finals = [], {}
    for flat in (None, "triton"):
        torch.manual_seed(0)
        module = Weights(shapes, "cuda")
        wrapped = vla_overlap.OverlapDataParallel(module, vla_overlap.OverlapConfig())
        opt = vla_overlap.DistributedAdamW(wrapped, lr=1e-4, weight_decay=0.05, flat=flat)
        gen = torch.Generator(device="cuda").manual_seed(1)
        grads = [torch.randn(p.shape, device="cuda", dtype=p.dtype, generator=gen) for p in module.params]
        params = list(module.params)
        times = []
        for step in range(3 + reps):
            opt.zero_grad()
            torch.autograd.backward(params, grads)  # the hooks copy them into the fp32 buffers
            wrapped.finish_grad_sync()
            torch.cuda.synchronize()
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            opt.clip_grad_norm_(1.0)
            opt.step()
            end.record()
            torch.cuda.synchronize()
            times.append(start.elapsed_time(end))
            if step == 2:
                finals[flat] = torch.cat([p.detach().reshape(-1) for p in params]).clone()
        numel = sum(p.numel() for p in params)
        ms = sorted(times[3:])[len(times[3:]) // 2]
        # read grad, master, m, v; write master, m, v, bf16 weights; plus the norm's read of the gradients
        rows.append({"pass": "clip + AdamW step + bf16 write-back", "variant": f"DistributedAdamW(flat={flat!r})",
                     "ms": round(ms, 3), "GB/s": round(numel * 34 / ms / 1e6)})  # fmt: skip
        del opt, wrapped, module
        torch.cuda.empty_cache()
    a, b = finals[None].view(torch.int16).int(), finals["triton"].view(torch.int16).int()
    ulps = (a - b).abs()
    rows[-1]["bf16_weights_after_3_steps"] = {
        "max_ulps_from_fused": int(ulps.max()),
        "fraction_differing": float((ulps > 0).float().mean()),
        "fraction_over_1_ulp": float((ulps > 1).float().mean()),
        "non_finite": [int((~torch.isfinite(finals[k])).sum()) for k in (None, "triton")],
        "max_abs_diff": float((finals[None].float() - finals["triton"].float()).abs().max()),
    }
    return rows


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--preset", default="n1.6-3b")
    p.add_argument("--reps", type=int, default=10)
    p.add_argument("--json", type=Path)
    args = p.parse_args()
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", "29533")
    dist.init_process_group("nccl", rank=0, world_size=1)
    shapes = trainable_shapes(args.preset)
    numel = sum(s.numel() for _, s, _ in shapes)
    print(f"{args.preset}: {len(shapes)} trainable tensors, {numel / 1e9:.3f} B elements", flush=True)
    rows = copies(shapes, args.reps)
    for row in rows:
        print(json.dumps(row), flush=True)
    torch.cuda.empty_cache()
    for row in optimizer(shapes, args.reps):
        rows.append(row)
        print(json.dumps(row), flush=True)
    report = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "preset": args.preset,
              "tensors": len(shapes), "elements": numel, "rows": rows}  # fmt: skip
    if args.json:
        args.json.write_text(json.dumps(report, indent=1))
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
