"""The ablation ladder of `gr00t-train bench`, measured in one run of the real trainer.

What each switch does: docs/architecture.md, "The speed switches"; the results: BENCHMARKS.md.

Rows (cumulative, gr00t_train._bench.LADDER): the LeRobot-style baseline (a torch DataLoader with workers,
eager, torch DDP, foreach AdamW, autocast) -> + vla-io pipeline -> + overlap -> + fused AdamW -> + CUDA graphs
-> + compiled blocks -> + bf16 weights -> + optimizer overlap -> + one-pass optimizer kernel -> + grouped
embodiment GEMMs -> + untouched table rows skipped -> + master remainders -> + Triton DiT attention -> + merged
DiT linears -> + staged update -> + FP8 frozen prefix (the stretch row: it changes the numerics). Same model,
data, device and steps in every row; each row prints samples/s, MFU (analytic FLOPs from gr00t_model against
the GPU's datasheet dense bf16 peak), the step breakdown and its speedup over the baseline. The baseline is
host-bound and varies between runs: it runs `--baseline-runs` times and the median counts.

Default setting: LIBERO-like, `n1.6-3b` with random weights, batch 16 per GPU, two 256x256 cameras.

    python -m vla_io synth /tmp/libero --preset libero --episodes 6           # the dataset, once
    PYTHONPATH=$(ls -d $PWD/packages/*/src | tr '\\n' ':') python benchmarks/train_ablation.py \\
        --dataset /tmp/libero --workers 12 --json benchmarks/results/train_ablation_h200_<date>.json

On a CPU, `--set model.preset=tiny --set data.num_workers=1` gives a quick (and noisy) run of the same code.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from gr00t_train.cli import main


def parse() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--dataset", type=Path, required=True, help="a LeRobot dataset (see the docstring)")
    p.add_argument("--model", default="n1.6-3b", help="gr00t_model preset")
    p.add_argument("--batch-size", type=int, default=16, help="samples per GPU per step")
    p.add_argument("--workers", type=int, default=8, help="decoding worker processes (async rows)")
    p.add_argument("--steps", type=int, default=20, help="measured steps per row")
    p.add_argument("--warmup", type=int, default=6, help="steps per row before measuring (graph capture)")
    p.add_argument("--rows", help="comma-separated row indices (default: all)")
    p.add_argument("--baseline-runs", type=int, default=3, help="runs of the baseline row (median counts)")
    p.add_argument("--out", default="runs/train_ablation", help="logs of each row")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE")
    p.add_argument("--json", type=Path, help="also write the results as JSON here")
    return p.parse_args()


def argv(args: argparse.Namespace) -> list[str]:
    """The `gr00t-train bench` command line of these arguments."""
    sets = [
        f"data.dataset={args.dataset}",
        f"model.preset={args.model}",
        f"data.batch_size={args.batch_size}",
        f"data.num_workers={args.workers}",
        f"output_dir={args.out}",
        "logging.progress=false",
        *args.overrides,
    ]
    out = ["bench", "--preset", "libero", "--steps", str(args.steps), "--warmup", str(args.warmup),
           "--baseline-runs", str(args.baseline_runs)]  # fmt: skip
    if args.rows:
        out += ["--rows", args.rows]
    if args.json:
        out += ["--json", str(args.json)]
    for item in sets:
        out += ["--set", item]
    return out


if __name__ == "__main__":
    sys.exit(main(argv(parse())))
