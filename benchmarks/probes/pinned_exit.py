"""How long a process holding pinned host memory takes to end (CUDA only): gr00t-train's checkpoint pool pins
about twice the optimizer state (38.7 GB for n1.6-3b) once per run, and a job's wall time ends with its exit.

    python benchmarks/probes/pinned_exit.py --gb 38 [--json OUT]

Each row is a child process that pins `--gb` in 256 MiB chunks (as `checkpoint.host_pool` does), frees them
into torch's pinned-memory cache, then ends one way; the parent times from the child's last line to its end:
  exit        the interpreter's normal exit (atexit handlers, CUDA's teardown)
  empty       torch's pinned cache emptied in the process first (timed apart), then the normal exit
  os_exit     os._exit(0) right after flushing: the kernel reclaims the process
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

CHILD = """
import os, sys, time, torch
chunks = [torch.empty(256 * 2**20, dtype=torch.uint8, pin_memory=True) for _ in range(int({gb} * 4))]
torch.cuda.synchronize()
del chunks
how = {how!r}
emptied = 0.0
if how == "empty":
    t = time.perf_counter()
    torch._C._host_emptyCache()
    emptied = time.perf_counter() - t
print(f"READY {{emptied:.3f}}", flush=True)
if how == "os_exit":
    sys.stdout.flush(); sys.stderr.flush()
    os._exit(0)
"""


def row(gb: float, how: str) -> dict[str, float]:
    started = time.perf_counter()
    proc = subprocess.Popen(
        [sys.executable, "-c", CHILD.format(gb=gb, how=how)], stdout=subprocess.PIPE, text=True
    )
    line = proc.stdout.readline()
    ready = time.perf_counter()
    proc.wait()
    ended = time.perf_counter()
    if not line.startswith("READY"):
        raise SystemExit(f"{how}: the child ended without its line (rc {proc.returncode})")
    return {"pin_s": ready - started, "in_process_empty_s": float(line.split()[1]), "end_s": ended - ready}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--gb", type=float, default=38.0)
    p.add_argument("--rows", default="exit,empty,os_exit")
    p.add_argument("--json", type=Path)
    args = p.parse_args()
    result = {"gb": args.gb, "date": time.strftime("%Y-%m-%d"), "rows": {}}
    for how in args.rows.split(","):
        result["rows"][how] = row(args.gb, how)
        print(how, ", ".join(f"{k} {v:.2f}" for k, v in result["rows"][how].items()), flush=True)
    if args.json:
        args.json.write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
