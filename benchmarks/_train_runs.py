"""What the multi-run benchmarks share: one `gr00t-train train` run of the libero preset through torchrun, quiet
and without checkpoints, its summary read back (train_scaling.py, grad_reduce_parity.py); the settings that keep
a measured run quiet and the report written (loss_parity.py, prefix_cache.py, memory_budget.py too)."""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

QUIET = ["logging.progress=false", "logging.plots=false", "logging.tensorboard=false",
         "checkpoint.save_final=false", "checkpoint.every=0", "checkpoint.existing_run=overwrite"]  # fmt: skip
"""A measured run writes no checkpoint and no plots, and replaces an earlier run of itself."""


def add_run_arguments(p: argparse.ArgumentParser, out: str) -> None:
    """The arguments every multi-run benchmark takes: the dataset, decoding workers, run folders, extra `--set`s
    and the JSON report."""
    p.add_argument("--dataset", type=Path, required=True, help="a LeRobot dataset")
    p.add_argument("--workers", type=int, default=6, help="decoding workers per rank")
    p.add_argument("--out", type=Path, default=Path(out), help="the runs' folders")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE")
    p.add_argument("--json", type=Path, help="also write the report as JSON here")


def command(nproc: int, sets: list[str]) -> list[str]:
    """torchrun (world size 1 too: the same launcher and code path) of `gr00t-train train --preset libero`."""
    out = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={nproc}",
           "-m", "gr00t_train", "train", "--preset", "libero"]  # fmt: skip
    for item in [*QUIET, *sets]:
        out += ["--set", item]
    return out


def train(label: str, nproc: int, sets: list[str], out_dir: Path) -> dict | None:
    """Run one training (`output_dir` = out_dir, after `sets`' own settings) and return its summary.json;
    None (after saying so) when it failed."""
    cmd = command(nproc, [*sets, f"output_dir={out_dir}"])
    print(f"{label}: {' '.join(cmd)}", flush=True)
    done = subprocess.run(cmd, env=os.environ.copy())
    if done.returncode != 0:
        print(f"{label} failed (exit {done.returncode})", file=sys.stderr)
        return None
    return json.loads((out_dir / "summary.json").read_text())


def write_report(path: Path | None, report: dict) -> None:
    if path is not None:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(report, indent=2) + "\n")
        print(f"wrote {path}")
