"""Where a checkpoint write's time goes, in the background thread that writes it. Runs anywhere (CPU only);
the state is `--gb` of fp32 moments in 256 MiB tensors (the optimizer file) and a quarter of that as the
model's file, written where an older checkpoint of the same size waits to be pruned (keep_last=2).

    python benchmarks/probes/checkpoint_write.py --gb 3.2 --reps 3 [--dir /tmp/checkpoint_write] [--json OUT]

Rows, each repetition after `os.sync()` into a new folder:
  crc     one part after the other, torch.save with its CRC-32 of every zip record
  serial  one part after the other without the CRC: save, hash every file (the manifest), fsync, prune, the
          older checkpoints in the page cache (as this writer left them before `checkpoint.sealing`)
  pruned  as serial, but the old checkpoint removed first (where memory is short, its cached pages freed
          before the write spares the writer the kernel's reclaim)
  sealed  `Checkpointer.write` as training runs it: each file hashed and flushed as soon as it is written,
          the old checkpoint removed beside the write (`checkpoint.sealing`, `Checkpointer._pruning_beside`)
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
from gr00t_train import Checkpointer
from gr00t_train.checkpoint.files import _fsync_tree
from gr00t_train.checkpoint.manifest import write_manifest


def parse() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--gb", type=float, default=3.2, help="bytes of optimizer state, in GB")
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--dir", type=Path, default=Path("/tmp/checkpoint_write"))
    p.add_argument("--rows", default="crc,serial,pruned,sealed")
    p.add_argument("--json", type=Path)
    return p.parse_args()


def _state(gb: float) -> dict:
    per_tensor = 64 * 1024 * 1024  # fp32 elements: 256 MiB
    count = max(2, round(gb * 1e9 / (per_tensor * 4)))
    return {"state": {i: {"exp_avg": torch.randn(per_tensor)} for i in range(count)}}


def _write(ck: Checkpointer, step: int, optimizer: dict, model: dict) -> None:
    ck.save(
        step, write_model=lambda folder: torch.save(model, folder / "model.pt"), optimizer_state=optimizer,
        rank_state={"data": step}, trainer_state={"step": step, "world_size": 1}, config={},
    )  # fmt: skip


def _read_back(root: Path) -> None:
    for path in root.rglob("*"):
        if path.is_file():
            with open(path, "rb") as f:
                while f.read(1 << 24):
                    pass


def serial_once(
    folder: Path, old: Path, optimizer: dict, model: dict, crc: bool, prune_first: bool
) -> dict[str, float]:
    folder.mkdir(parents=True)
    laps: dict[str, float] = {}
    if prune_first:
        wall = time.perf_counter()
        shutil.rmtree(old)
        laps["prune"] = time.perf_counter() - wall
    torch.serialization.set_crc32_options(crc)
    try:
        wall, cpu = time.perf_counter(), time.thread_time()
        with open(folder / "optimizer.pt", "wb") as f:
            torch.save(optimizer, f)
        laps["optimizer"], laps["save_cpu"] = time.perf_counter() - wall, time.thread_time() - cpu
        wall = time.perf_counter()
        with open(folder / "model.pt", "wb") as f:
            torch.save(model, f)
        laps["model"] = time.perf_counter() - wall
    finally:
        torch.serialization.set_crc32_options(True)
    for part, work in (
        ("manifest", lambda: write_manifest(folder, {})),
        ("fsync", lambda: _fsync_tree(folder)),
        ("prune", lambda: shutil.rmtree(old, ignore_errors=prune_first)),
    ):
        wall = time.perf_counter()
        work()
        laps[part] = laps.get(part, 0.0) + time.perf_counter() - wall
    laps["total"] = sum(v for k, v in laps.items() if k != "save_cpu")
    return laps


def sealed_once(root: Path, optimizer: dict, model: dict) -> dict[str, float]:
    ck = Checkpointer(root, keep_last=2, run_id="probe")
    os.sync()
    wall = time.perf_counter()
    _write(ck, 3, optimizer, model)
    laps = dict(ck.write_clock.laps)
    laps["total"] = time.perf_counter() - wall
    return laps


def main() -> None:
    args = parse()
    optimizer, model = _state(args.gb), _state(args.gb / 4)
    gb = sum(t.numel() * 4 for s in (optimizer, model) for d in s["state"].values() for t in d.values()) / 1e9
    rows: dict[str, list[dict[str, float]]] = {name: [] for name in args.rows.split(",")}
    for rep in range(args.reps):
        for name in rows:
            root = args.dir / f"{name}_{rep}"
            shutil.rmtree(root, ignore_errors=True)
            ck = Checkpointer(root, keep_last=2, run_id="probe")
            _write(ck, 1, optimizer, model)  # the checkpoints a save finds: the oldest is pruned
            _write(ck, 2, optimizer, model)
            if name != "sealed":  # as the writer before `checkpoint.sealing` left them: in the page cache
                _read_back(root)
            if name == "sealed":
                laps = sealed_once(root, optimizer, model)
            else:
                os.sync()
                old = root / "step_000001"
                laps = serial_once(root / "new", old, optimizer, model, name == "crc", name == "pruned")
            shutil.rmtree(root)
            rows[name].append(laps)
            print(f"{gb:.2f} GB, {name:6s} rep {rep}: " + ", ".join(f"{k} {v:.2f}" for k, v in laps.items()))
    medians = {
        name: {k: statistics.median(r[k] for r in laps) for k in laps[0]} for name, laps in rows.items()
    }
    for name, laps in medians.items():
        print(f"median {name:6s}: " + ", ".join(f"{k} {v:.2f}" for k, v in laps.items()))
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        result = {
            "gb": gb,
            "reps": args.reps,
            "rows": rows,
            "medians": medians,
            "date": time.strftime("%Y-%m-%d"),
        }
        args.json.write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
