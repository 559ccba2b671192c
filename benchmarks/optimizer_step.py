"""The step's memory-bound passes over the trainable weights of n1.6-3b, alone on the GPU: the bf16 -> fp32
gradient copies (torch's mixed-dtype copy vs vla-overlap's cast kernel), the fp32 -> bf16 parameter
write-back (torch), DistributedAdamW's step (clip + update + write-back) with torch's fused AdamW vs the flat
Triton kernel, and that kernel alone at several block sizes next to torch's fused AdamW on one flat tensor.

Parameters have the model's trainable shapes and dtypes (bf16 working weights), random values; copies are
captured in one CUDA graph per variant (no launch overhead, as in training) and timed by replaying it. Each
row gives ms and the bandwidth reached (bytes the pass must move / time), and whether the fast path equals the
reference bit for bit (copies) or how far it is from it (optimizer: the weights after 3 steps).

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

    config = GR00TConfig.preset(
        preset, compute_dtype="bfloat16", frozen_dtype="bfloat16", trainable_dtype="bfloat16"
    )
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
    grads = [torch.randn(s, device="cuda", dtype=torch.bfloat16) for _, s, _ in shapes]
    numel = sum(g.numel() for g in grads)
    rows = []
    for buffer_dtype in (torch.float32, torch.bfloat16):
        rows += _copies_into(grads, numel, buffer_dtype, reps)
    flat = torch.empty(numel, device="cuda")
    masters, weights = flat.normal_(), torch.empty(numel, device="cuda", dtype=torch.bfloat16)
    ms = timed_graph(lambda: weights.copy_(masters), reps)
    rows.append({"pass": "fp32 master -> bf16 weights (one flat copy)", "variant": "torch", "ms": round(ms, 3),
                 "GB/s": round(numel * 6 / ms / 1e6)})  # fmt: skip
    return rows


def _copies_into(grads, numel: int, buffer_dtype: torch.dtype, reps: int) -> list[dict]:
    from vla_overlap._cast_kernel import cast_into

    flat = torch.empty(numel, device="cuda", dtype=buffer_dtype)
    views, offset = [], 0
    for g in grads:
        views.append(flat[offset : offset + g.numel()].view(g.shape))
        offset += g.numel()
    size = flat.element_size()
    rows = []
    for what, nbytes in (("copy", 2 + size), ("add", 2 + 2 * size)):
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
            rows.append({"pass": f"bf16 grad -> {str(buffer_dtype)[6:]} buffer ({what}, {len(grads)} tensors)",
                         "variant": name, "ms": round(ms, 3), "GB/s": round(numel * nbytes / ms / 1e6)})  # fmt: skip
        rows[-1]["bitwise_equal_to_torch"] = bool(torch.equal(results["torch"], results["cast kernel"]))
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
    rows[-1]["weights_after_3_steps_vs_fused"] = {
        "max_abs_diff": float((finals[None] - finals["triton"]).abs().max()),
        "fraction_differing": float((finals[None] != finals["triton"]).float().mean()),
        "non_finite": [int((~torch.isfinite(finals[k])).sum()) for k in (None, "triton")],
    }
    return rows


def kernels(numel: int, reps: int) -> list[dict]:
    """The flat kernel alone over one run of `numel` elements at several block sizes, and torch's fused
    AdamW over the same flat tensor (its best case: one tensor), for the bandwidth each reaches."""
    from vla_overlap._flat_adamw_kernel import adamw_flat

    p, g, m, v = (torch.rand(numel, device="cuda") for _ in range(4))
    out = torch.empty(numel, device="cuda", dtype=torch.bfloat16)
    table = torch.tensor([[1 - 1e-6, 0.9, 0.999, 1e-8, 1e-4, 0.03, 0, 0]], device="cuda")
    coef = torch.tensor(0.5, device="cuda")
    rows = []
    for block, warps in ((1024, 4), (2048, 4), (2048, 8), (4096, 8), (4096, 16), (8192, 8)):
        starts = torch.arange(0, numel, block, device="cuda")
        blocks = torch.stack([starts, (numel - starts).clamp(max=block), torch.zeros_like(starts)], 1)

        def step(blocks=blocks, block=block, warps=warps):
            adamw_flat(p, g, m, v, out, blocks, table, coef, block=block, num_warps=warps)

        ms = timed_graph(step, reps)
        rows.append({"pass": "flat AdamW kernel alone (one run)", "variant": f"block {block}, {warps} warps",
                     "ms": round(ms, 3), "GB/s": round(numel * 30 / ms / 1e6)})  # fmt: skip
    p.grad = g
    opt = torch.optim.AdamW([p], lr=1e-4, fused=True, capturable=True)
    opt.step()
    ms = timed_graph(opt.step, reps)  # fused AdamW is capturable with its step counter on the device
    rows.append({"pass": "torch fused AdamW, one flat fp32 tensor (no bf16 copy)", "variant": "torch",
                 "ms": round(ms, 3), "GB/s": round(numel * 28 / ms / 1e6)})  # fmt: skip
    return rows


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--preset", default="n1.6-3b")
    p.add_argument("--reps", type=int, default=10)
    p.add_argument("--json", type=Path)
    p.add_argument("--only", choices=["copies", "optimizer", "kernels"], help="one section")
    args = p.parse_args()
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", "29533")
    dist.init_process_group("nccl", rank=0, world_size=1)
    shapes = trainable_shapes(args.preset)
    numel = sum(s.numel() for _, s, _ in shapes)
    print(f"{args.preset}: {len(shapes)} trainable tensors, {numel / 1e9:.3f} B elements", flush=True)
    rows = []
    sections = {"copies": copies, "optimizer": optimizer, "kernels": lambda s, r: kernels(numel, r)}
    for name, section in sections.items():
        if args.only in (None, name):
            for row in section(shapes, args.reps):
                rows.append(row)
                print(json.dumps(row), flush=True)
            torch.cuda.empty_cache()
    report = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "preset": args.preset,
              "tensors": len(shapes), "elements": numel, "rows": rows}  # fmt: skip
    if args.json:
        args.json.write_text(json.dumps(report, indent=1))
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
