"""Could the next microbatch's frozen prefix run beside this one's trainable forward and backward? (issue 12)

    PYTHONPATH=<the packages' src folders> python benchmarks/prefix_ahead_probe.py [--json OUT]

Today the step's first phase is the frozen prefix (vision tower, frozen LLM layers; GEMM-bound) beside the
optimizer's update (memory-bound): the two cost about their sum (BENCHMARKS.md, thirteenth pass). The
trainable part after it (the DiT's small GEMMs and kernels, Qwen3's trainable layers) leaves SMs idle. The
prefix reads no trainable weight, so the next microbatch's prefix could run beside the trainable part instead,
and the update alone before it. This probe times both schedules on graphs of the real model:

    today:  [update on a side stream | prefix]  then  [trainable fwd+bwd]
    ahead:  [update]  then  [trainable fwd+bwd (high priority) | next prefix (low priority)]

The update is a stand-in with the flat optimizer's bytes per parameter (bf16 gradient, fp32 master and moments,
bf16 weight out: 30 bytes) over 1.62 B parameters.
"""

from __future__ import annotations

import argparse
import json

import torch
import triton
import triton.language as tl
from _probe_model import full_model_and_batch

N = 4096 * 395_508  # 1.62 B, whole blocks


@triton.jit
def adamw_like(p_ptr, g_ptr, m_ptr, v_ptr, out_ptr, BLOCK: tl.constexpr):
    o = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    p, m, v = tl.load(p_ptr + o), tl.load(m_ptr + o), tl.load(v_ptr + o)
    g = tl.load(g_ptr + o).to(tl.float32)
    m = m + 0.1 * (g - m)
    v = v * 0.999 + 0.001 * g * g
    p = p * 0.9999 - 1e-4 * m / (tl.sqrt(v) + 1e-8)
    tl.store(p_ptr + o, p)
    tl.store(m_ptr + o, m)
    tl.store(v_ptr + o, v)
    tl.store(out_ptr + o, p.to(tl.bfloat16))


class Update:
    def __init__(self) -> None:
        self.p, self.m, self.v = (torch.rand(N, device="cuda") for _ in range(3))
        self.g, self.out = (torch.rand(N, device="cuda", dtype=torch.bfloat16) for _ in range(2))

    def run(self) -> None:
        adamw_like[(N // 4096,)](self.p, self.g, self.m, self.v, self.out, BLOCK=4096, num_warps=8)


def captured(fn, priority: int) -> torch.cuda.CUDAGraph:
    """`fn` warmed up, then captured on a stream of `priority` (replayed kernels keep it)."""
    stream = torch.cuda.Stream(priority=priority)
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(3):
            fn()
    torch.cuda.current_stream().wait_stream(stream)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, stream=stream):
        fn()
    torch.cuda.synchronize()
    return graph


def timed(schedule, reps: int = 6) -> float:
    """Milliseconds of one call of `schedule` (which queues work on streams and joins them to the current)."""
    times = []
    for _ in range(reps):
        torch.cuda.synchronize()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        schedule()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    return sum(times[1:]) / (reps - 1)


def beside(first, second, second_priority: int = 0):
    """A schedule running `first` on the current stream and `second` on a side stream of `second_priority`."""
    side = torch.cuda.Stream(priority=second_priority)

    def run() -> None:
        main = torch.cuda.current_stream()
        side.wait_stream(main)
        with torch.cuda.stream(side):
            second()
        first()
        main.wait_stream(side)

    return run


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--json")
    args = p.parse_args()
    torch.backends.cuda.matmul.allow_tf32 = True
    torch.backends.cudnn.allow_tf32 = True
    model, batch = full_model_and_batch(triton_attention=True)
    action = batch["action"]
    noise = torch.randn(action.shape, device="cuda")
    t = torch.rand(action.shape[0], device="cuda")
    with torch.no_grad():
        prefix = model.frozen_prefix(batch)

    def prefix_fn():
        with torch.no_grad():
            model.frozen_prefix(batch)

    def train_fn():
        model(batch, noise, t, prefix=prefix)["loss"].backward()

    graphs = {
        "prefix low": captured(prefix_fn, 0),
        "prefix high": captured(prefix_fn, -1),
        "train high": captured(train_fn, -1),
        "train low": captured(train_fn, 0),
    }
    update = Update()
    upd = update.run
    pre_lo, pre_hi = graphs["prefix low"].replay, graphs["prefix high"].replay
    train_hi, train_lo = graphs["train high"].replay, graphs["train low"].replay

    def seq(*parts):
        return lambda: [part() for part in parts]

    rows = {
        "update alone": upd,
        "prefix alone": pre_hi,
        "train alone": train_hi,
        "today: (prefix | update) + train": seq(beside(pre_hi, upd), train_hi),
        "serial: update + prefix + train": seq(upd, pre_hi, train_hi),
        "ahead: update + (train hi | prefix lo)": seq(upd, beside(train_hi, pre_lo)),
        "ahead, equal priority: update + (train | prefix)": seq(upd, beside(train_lo, pre_lo)),
        "ahead, prefix first: update + (prefix hi | train lo)": seq(upd, beside(pre_hi, train_lo)),
        "train hi | prefix lo": beside(train_hi, pre_lo),
    }
    result = {}
    for name, fn in rows.items():
        result[name] = round(timed(fn), 2)
        print(f"{name:55s} {result[name]:7.2f} ms", flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=1)


if __name__ == "__main__":
    main()
