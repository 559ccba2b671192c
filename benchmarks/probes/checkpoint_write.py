"""Where a checkpoint write's time goes, in the background thread that writes it: torch.save of the optimizer
state (with and without its CRC-32 of every zip record), the manifest's SHA-256 of the files (read back), and
the fsync. Runs anywhere (CPU only); the state is `--gb` of fp32 moments in 256 MiB tensors.

    python benchmarks/probes/checkpoint_write.py --gb 3.2 --reps 3 [--dir /tmp/checkpoint_write] [--json OUT]

Each repetition writes once with torch.save's CRC-32 and once without, after `os.sync()`, into a new folder,
and reports wall and thread CPU seconds per part. gr00t-train writes without the CRC
(`gr00t_train.checkpoint.files`): the manifest covers every byte.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import time
from pathlib import Path

import torch
from gr00t_train.checkpoint.files import _fsync_tree
from gr00t_train.checkpoint.manifest import write_manifest


def parse() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--gb", type=float, default=3.2, help="bytes of optimizer state, in GB")
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--dir", type=Path, default=Path("/tmp/checkpoint_write"))
    p.add_argument("--json", type=Path)
    return p.parse_args()


def write_once(state: dict, folder: Path, crc: bool) -> dict[str, float]:
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    os.sync()
    torch.serialization.set_crc32_options(crc)
    try:
        laps, wall, cpu = {}, time.perf_counter(), time.thread_time()
        with open(folder / "optimizer.pt", "wb") as f:
            torch.save(state, f)
        laps["save_s"], laps["save_cpu_s"] = time.perf_counter() - wall, time.thread_time() - cpu
        wall = time.perf_counter()
        write_manifest(folder, {})
        laps["manifest_s"] = time.perf_counter() - wall
        wall = time.perf_counter()
        _fsync_tree(folder)
        laps["fsync_s"] = time.perf_counter() - wall
    finally:
        torch.serialization.set_crc32_options(True)
    laps["total_s"] = laps["save_s"] + laps["manifest_s"] + laps["fsync_s"]
    shutil.rmtree(folder)
    return laps


def main() -> None:
    args = parse()
    per_tensor = 64 * 1024 * 1024  # fp32 elements: 256 MiB
    count = max(2, round(args.gb * 1e9 / (per_tensor * 4)))
    state = {"state": {i // 2: {} for i in range(count)}}
    for i in range(count):
        state["state"][i // 2]["exp_avg" if i % 2 == 0 else "exp_avg_sq"] = torch.randn(per_tensor)
    gb = count * per_tensor * 4 / 1e9
    rows: dict[str, list[dict[str, float]]] = {"crc": [], "no_crc": []}
    for rep in range(args.reps):
        for name, crc in (("crc", True), ("no_crc", False)):
            laps = write_once(state, args.dir / f"{name}_{rep}", crc)
            rows[name].append(laps)
            print(f"{gb:.2f} GB, {name:6s} rep {rep}: " + ", ".join(f"{k} {v:.2f}" for k, v in laps.items()))
    medians = {name: {k: statistics.median(r[k] for r in laps) for k in laps[0]} for name, laps in rows.items()}
    for name, laps in medians.items():
        print(f"median {name:6s}: " + ", ".join(f"{k} {v:.2f}" for k, v in laps.items()))
    saved = medians["crc"]["save_s"] - medians["no_crc"]["save_s"]
    print(f"CRC-32 costs {saved:.2f} s of {gb:.2f} GB ({saved / gb:.3f} s/GB) in the writing thread")
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        result = {"gb": gb, "reps": args.reps, "rows": rows, "medians": medians, "date": time.strftime("%Y-%m-%d")}
        args.json.write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
