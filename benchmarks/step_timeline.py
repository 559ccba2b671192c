"""One step of a profiled timeline: how busy each CUDA stream is, where the compute stream idles between
kernels, and which kernels cost the most with the gap that follows each (what a CUDA graph's launches cost).

    python benchmarks/step_timeline.py TRACE.json.gz [--start MS --stop MS] [--top 30] [--bins MS] [--list]

TRACE is a Chrome trace of graphed steps (`step_variants.py --rows profile=ours-full --trace DIR`, or a run's
`trace_rank0.json.gz` from `logging.profile_steps`). Kernel families (GEMM, attention, ...) come from the
profile rows themselves; this reads the time between kernels, which they do not see. It found the 4-byte
memsets before cuBLAS's GEMMs (BENCHMARKS.md, "Levers tried": no cuBLAS workspace).

The step is found without host markers (graph replays carry none): with the optimizer on a side stream, a
step runs from one start of that stream's work to the next (the second such start, so the window is whole);
with one stream, pass `--start` and `--stop` (ms from the trace's first kernel). Those also pick any
phase of a step (e.g. the DiT's backward).
"""

from __future__ import annotations

import argparse
import collections
import gzip
import json
from pathlib import Path

GPU_KINDS = ("kernel", "gpu_memcpy", "gpu_memset")
SIDE_IDLE_US = 2000  # a pause this long on the side stream ends one step's update


def load(path: Path) -> list[dict]:
    """The trace's GPU events, in time order."""
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt") as f:
        events = json.load(f)["traceEvents"]
    return sorted(
        (e for e in events if e.get("ph") == "X" and e.get("cat") in GPU_KINDS), key=lambda e: e["ts"]
    )


def step_window(events: list[dict], main: int) -> tuple[float, float]:
    """(start, stop) in trace us of the second whole step: between two starts of the side stream's work."""
    side = [e for e in events if e["tid"] != main]
    starts, end = [], None
    for e in side:
        if end is None or e["ts"] - end > SIDE_IDLE_US:
            starts.append(e["ts"])
        end = e["ts"] + e["dur"]
    if len(starts) < 3:
        raise SystemExit("fewer than three side-stream starts: pass --start and --stop")
    return starts[1], starts[2]


def family(name: str) -> str:
    low = name.lower()
    if "memset" in low:
        return "memset"
    if any(w in low for w in ("nvjet", "gemm", "splitk", "cutlass")):
        return "gemm"
    if any(w in low for w in ("cudnn", "fmha", "flash")):
        return "attention"
    return "triton" if low.startswith("triton") else "other"


def summarize(events: list[dict], start: float, stop: float, main: int, top: int) -> dict:
    window = [e for e in events if start <= e["ts"] < stop]
    streams = collections.Counter()
    for e in window:
        streams[e["tid"]] += e["dur"]
    compute = [e for e in window if e["tid"] == main]
    gaps = [b["ts"] - (a["ts"] + a["dur"]) for a, b in zip(compute, compute[1:])]
    kinds: dict[str, list[float]] = collections.defaultdict(lambda: [0, 0.0, 0.0])
    names: dict[str, list[float]] = collections.defaultdict(lambda: [0, 0.0])
    for e, gap in zip(compute, [*gaps, 0.0]):
        kind = kinds[family(e["name"])]
        kind[0], kind[1], kind[2] = kind[0] + 1, kind[1] + e["dur"], kind[2] + gap
        entry = names[e["name"][:110]]
        entry[0], entry[1] = entry[0] + 1, entry[1] + e["dur"] + min(gap, 50.0)  # a long gap is another cause
    return {
        "window_ms": round((stop - start) / 1e3, 2),
        "busy_ms_by_stream": {str(t): round(us / 1e3, 2) for t, us in streams.items()},
        "compute_stream": {"kernels": len(compute), "idle_ms": round(sum(gaps) / 1e3, 2),
                           "idle_ms_in_gaps_under_100us": round(sum(g for g in gaps if g < 100) / 1e3, 2)},
        "by_family": {k: {"kernels": n, "ms": round(us / 1e3, 2), "gaps_after_ms": round(g / 1e3, 2)}
                      for k, (n, us, g) in sorted(kinds.items(), key=lambda kv: -kv[1][1])},
        "top_with_gaps": [[name, n, round(us / 1e3, 3)]
                          for name, (n, us) in sorted(names.items(), key=lambda kv: -kv[1][1])[:top]],
    }  # fmt: skip


def bins(events: list[dict], start: float, stop: float, main: int, width_ms: float) -> list[dict]:
    """Per `width_ms` of the window: busy ms of the compute stream and of the others, and the compute kernels
    that start in it. Shows where the streams take turns (in 2026-12-02's profile: the first 18 ms of a step)."""
    width = width_ms * 1e3
    rows = [{"from_ms": round(i * width_ms, 3), "compute_ms": 0.0, "other_ms": 0.0, "kernels": 0}
            for i in range(int((stop - start) // width) + 1)]  # fmt: skip
    for e in events:
        if start <= e["ts"] < stop:
            row = rows[int((e["ts"] - start) // width)]
            row["compute_ms" if e["tid"] == main else "other_ms"] += e["dur"] / 1e3
            row["kernels"] += e["tid"] == main
    return [{**r, "compute_ms": round(r["compute_ms"], 3), "other_ms": round(r["other_ms"], 3)} for r in rows]


def kernel_list(
    events: list[dict], start: float, stop: float, main: int
) -> list[tuple[float, float, float, str]]:
    """Every compute-stream kernel of the window: (ms from its start, us long, us of gap before it, name)."""
    compute = [e for e in events if start <= e["ts"] < stop and e["tid"] == main]
    return [
        ((e["ts"] - start) / 1e3, e["dur"], 0.0 if i == 0 else e["ts"] - compute[i - 1]["ts"] - compute[i - 1]["dur"],
         e["name"])
        for i, e in enumerate(compute)
    ]  # fmt: skip


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("trace", type=Path)
    p.add_argument(
        "--start", type=float, help="ms from the first kernel (with --stop; default: a whole step)"
    )
    p.add_argument("--stop", type=float)
    p.add_argument("--top", type=int, default=30)
    p.add_argument("--bins", type=float, metavar="MS", help="also print each stream's busy time per MS ms")
    p.add_argument("--list", action="store_true", help="also print every compute-stream kernel of the window")
    args = p.parse_args()
    events = load(args.trace)
    main_stream = collections.Counter(e["tid"] for e in events).most_common(1)[0][0]
    if args.start is not None and args.stop is not None:
        start, stop = events[0]["ts"] + args.start * 1e3, events[0]["ts"] + args.stop * 1e3
    else:
        start, stop = step_window(events, main_stream)
    found = summarize(events, start, stop, main_stream, args.top)
    ranked = found.pop("top_with_gaps")
    found["window_start_ms"] = round((start - events[0]["ts"]) / 1e3, 3)  # for --start/--stop inside it
    print(json.dumps(found, indent=1))
    print("kernels of the compute stream by time plus the gap after each (capped at 50 us): count, ms")
    for name, count, ms in ranked:
        print(f"{count:6d} {ms:8.3f}  {name}")
    if args.bins:
        print(
            f"per {args.bins} ms of the window: from ms, compute stream busy ms, other streams busy ms, kernels"
        )
        for row in bins(events, start, stop, main_stream, args.bins):
            print(
                f"{row['from_ms']:8.2f} {row['compute_ms']:7.2f} {row['other_ms']:7.2f} {row['kernels']:6d}"
            )
    if args.list:
        print("compute-stream kernels: ms from the window's start, us long, us of gap before, name")
        for at, us, gap, name in kernel_list(events, start, stop, main_stream):
            print(f"{at:9.3f} {us:8.1f} {gap:7.1f}  {name[:120]}")


if __name__ == "__main__":
    main()
