"""memory.budget_gib on one GPU capped to emulate smaller cards: techniques chosen, predicted and measured peak,
samples/s and MFU per budget, and LoRA's peak.

Each row is its own `gr00t-train train` process (n1.6-3b, effective batch 16, the dataset's two cameras) with
$GR00T_TRAIN_MEMORY_CAP_GIB capping its CUDA allocator (torch.cuda.set_per_process_memory_fraction) at the
budget, and memory.budget_gib set to it, so the planner chooses what fits and the cap proves it:

    24, 32, 48     budgeted and capped at that many GiB
    none           uncapped, the default run (planned against the whole GPU only to record its prediction:
                   nothing is chosen, so it runs as without a budget)
    lora           model.lora.rank=32, uncapped, planned the same way
    32@full        a budget with memory.recompute_policy set (full or selective): the planner tries only it
    recompute:dit:full, recompute:dit:selective, recompute:dit+llm:selective, ...
                   uncapped, planned the same way, with memory.recompute and memory.recompute_policy set:
                   the policies' peaks and samples/s side by side

Per row it prints the measured peak (torch.cuda.max_memory_allocated over the run, and after step 1) next to
the prediction per component. The states are predicted exactly, so what the peak holds beyond them is the
activations and the workspace: over the rows, `gpu_factor` (what the GPU keeps over the CPU-counted activation
model) and `cuda_workspace_gib` are fitted by least squares (the workspace kept as it is where the rows'
activations do not differ enough), printed, and with --write-calibration written to
gr00t_train/memory/calibration.json, which the planner reads. Rows whose blocks are recomputed selectively are
left out of that fit (compiled selective checkpointing keeps exactly what its policy says, which the factor
fitted to plain and fully recomputed rows need not describe); their measured over predicted activations are
printed beside it. A budget the planner refuses is a row with its error. About 1-1.5 minutes a row on an
H200 (compilation, 30 steps).

The recompute policies on n1.6-3b (DiT recomputed, full against selective, and both beside the default run):

    source benchmarks/gpu_env.sh && python benchmarks/memory_budget.py --dataset /tmp/libero \
        --rows none,recompute:dit:full,recompute:dit:selective \
        --json benchmarks/results/memory_recompute_policy_h200_<date>.json

    python -m vla_io synth /tmp/libero --preset libero --episodes 10 --image-size 256
    source benchmarks/gpu_env.sh && python benchmarks/memory_budget.py --dataset /tmp/libero \\
        --json benchmarks/results/memory_budget_h200_<date>.json
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

from _train_runs import write_report

STATES = ("frozen_weights", "trainable_weights", "masters", "moments", "gradients")


def parse() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--dataset", type=Path, required=True)
    p.add_argument("--cameras", default="image,wrist_image")
    p.add_argument("--rows", default="24,32,48,none,lora",
                   help="budgets in GiB (optionally @full or @selective), none, lora, recompute:BLOCKS:POLICY")  # fmt: skip
    p.add_argument("--batch", type=int, default=16, help="effective batch per GPU")
    p.add_argument("--lora-rank", type=int, default=32)
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--warmup", type=int, default=10, help="leading steps left out of samples/s")
    p.add_argument("--out", type=Path, default=Path("/tmp/memory_budget"))
    p.add_argument("--json", type=Path)
    p.add_argument("--write-calibration", action="store_true",
                   help="write the fitted gpu_factor and cuda_workspace_gib to gr00t_train/memory/calibration.json")  # fmt: skip
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                   help="more settings for every row")  # fmt: skip
    return p.parse_args()


def _gpu_gib() -> float:
    import torch

    if not torch.cuda.is_available():  # a CPU check of the script (--set model.preset=tiny)
        return 1024.0
    return torch.cuda.get_device_properties(0).total_memory / 2**30


def row_settings(row: str) -> tuple[float | None, list[str]]:
    """A row's budget (None: uncapped) and the memory settings it adds: `32`, `32@selective`, `none`, `lora`,
    `recompute:dit+llm:full`."""
    if row in ("none", "lora"):
        return None, []
    if row.startswith("recompute:"):
        _, blocks, policy = row.split(":")
        return None, [f"memory.recompute=[{blocks.replace('+', ',')}]", f"memory.recompute_policy={policy}"]
    budget, _, policy = row.partition("@")
    return float(budget), [f"memory.recompute_policy={policy}"] if policy else []


def _run(args: argparse.Namespace, row: str) -> dict:
    out = args.out / row.replace(":", "_").replace("@", "_").replace("+", "_")
    lora = row == "lora"
    budget, memory = row_settings(row)
    sets = [
        f"data.dataset={args.dataset}", f"data.cameras={args.cameras}", f"data.batch_size={args.batch}",
        "model.preset=n1.6-3b", f"steps={args.steps}", f"logging.summary_skip={args.warmup}",
        "logging.progress=false", "logging.plots=false", "eval.every=0", "checkpoint.save_final=false",
        f"output_dir={out}", f"memory.budget_gib={budget if budget is not None else _gpu_gib():g}",
        *([f"model.lora.rank={args.lora_rank}"] if lora else []), *memory, *args.overrides,
    ]  # fmt: skip
    argv = [sys.executable, "-m", "gr00t_train", "train", "--overwrite"]
    for item in sets:
        argv += ["--set", item]
    env = dict(os.environ)
    env.pop("GR00T_TRAIN_MEMORY_CAP_GIB", None)
    if budget is not None:
        env["GR00T_TRAIN_MEMORY_CAP_GIB"] = f"{budget:g}"
    started = time.perf_counter()
    proc = subprocess.run(argv, capture_output=True, text=True, env=env)
    base = {"row": row, "budget_gib": budget, "lora_rank": args.lora_rank if lora else 0,
            "process_s": round(time.perf_counter() - started, 1)}  # fmt: skip
    if proc.returncode != 0:
        lines = [line for line in proc.stderr.splitlines() if "error" in line.lower()]
        return {
            **base,
            "error": (lines or proc.stderr.splitlines() or ["?"])[-1],
            "exit_code": proc.returncode,
        }
    summary = json.loads((out / "summary.json").read_text())
    plan = summary["memory_plan"]
    predicted = plan["predicted_gib"]
    peak = summary["peak_memory_gib"]  # None on a CPU
    states = sum(predicted[k] for k in STATES)
    left = None if peak is None else round(peak - states, 2)
    return {
        **base,
        "techniques": plan["techniques"],
        "recompute": plan.get("recompute", "none"),
        "microbatch": plan["microbatch"],
        "grad_accum": plan["grad_accum"],
        "adam_moments": plan["adam_moments"],
        "peak_gib": None if peak is None else round(peak, 2),
        "peak_step1_gib": plan["measured_peak_step1_gib"],
        "predicted_gib": predicted["total"],
        "predicted": predicted,
        "samples_per_s": summary["samples_per_s"],
        "mfu": summary["mfu"],
        "step_ms": 1000 * summary["step_time_s"],
        "activations_and_workspace_measured_gib": left,
        "eager_activations_gib": plan["predicted_detail_gib"]["eager_activations"],
        "dropout_masks_gib": plan["predicted_detail_gib"]["dropout_masks"],
    }


def fit_calibration(rows: list[dict], workspace_gib: float) -> dict | None:
    """gpu_factor and cuda_workspace_gib from the rows' measured peaks: peak - states - masks = factor x eager
    activations + workspace, least squares; the workspace kept where the eager activations span < 0.25 GiB."""
    points = [
        (r["eager_activations_gib"], r["activations_and_workspace_measured_gib"] - r["dropout_masks_gib"])
        for r in rows
        if r.get("activations_and_workspace_measured_gib") is not None
        and r.get("peak_gib")
        and "selective" not in r.get("recompute", "")
    ]
    if not points or max(a for a, _ in points) <= 0:
        return None
    xs, ys = [a for a, _ in points], [y for _, y in points]
    if max(xs) - min(xs) >= 0.25:
        mx, my = sum(xs) / len(xs), sum(ys) / len(ys)
        factor = sum((x - mx) * (y - my) for x, y in points) / sum((x - mx) ** 2 for x in xs)
        workspace = my - factor * mx
    else:
        workspace = workspace_gib
        factor = sum(y - workspace for y in ys) / sum(xs)
    return {"gpu_factor": round(max(factor, 0.01), 3), "cuda_workspace_gib": round(max(workspace, 0.0), 2)}


def main() -> None:
    args = parse()
    args.out.mkdir(parents=True, exist_ok=True)
    rows = []
    for row in args.rows.split(","):
        rows.append(_run(args, row))
        print(json.dumps(rows[-1]), flush=True)
    w = max(6, *(len(r["row"]) for r in rows))
    print(f"\n{'row':<{w}} {'peak GiB':>8} {'pred GiB':>8} {'samples/s':>9} {'MFU':>6}  techniques")
    for r in rows:
        if "error" in r:
            print(f"{r['row']:<{w}} refused or failed: {r['error']}")
            continue
        chosen = ", ".join(r["techniques"]) or "none"
        print(f"{r['row']:<{w}} {r['peak_gib'] or 0:>8.2f} {r['predicted_gib']:>8.2f} {r['samples_per_s']:>9.1f} "
              f"{100 * (r['mfu'] or 0):>5.1f}%  {chosen} "
              f"(microbatch {r['microbatch']} x {r['grad_accum']}, moments {r['adam_moments']}, "
              f"recompute {r['recompute']})")  # fmt: skip
    from gr00t_train.memory.activations import CALIBRATION_FILE, calibration

    current = calibration()
    fitted = fit_calibration(rows, current["cuda_workspace_gib"])
    for r in rows:  # selective rows: what the calibration in use predicts for them against what they kept
        if "selective" in r.get("recompute", "") and r.get("peak_gib"):
            predicted = r["predicted"]["activations"] + r["predicted"]["workspace"]
            print(f"{r['row']}: activations and workspace measured {r['activations_and_workspace_measured_gib']:.2f}"
                  f" GiB, predicted {predicted:.2f} GiB")  # fmt: skip
    print(f"\ncalibration in use: gpu_factor {current['gpu_factor']}, workspace {current['cuda_workspace_gib']} GiB "
          f"({current['source']})\nfitted to these rows: {fitted}")  # fmt: skip
    if fitted is not None and args.write_calibration:
        source = (f"benchmarks/memory_budget.py on {_gpu_name()}, {time.strftime('%Y-%m-%d')}: rows {args.rows}, "
                  f"n1.6-3b, effective batch {args.batch}, least squares over the measured peaks")  # fmt: skip
        CALIBRATION_FILE.write_text(json.dumps({**fitted, "source": source}, indent=2) + "\n")
        print(f"written: {CALIBRATION_FILE}")
    report = {"date": time.strftime("%Y-%m-%d"), "calibration_used": current, "calibration_fitted": fitted,
              "rows": rows}  # fmt: skip
    write_report(args.json, report)


def _gpu_name() -> str:
    import torch

    return torch.cuda.get_device_name(0) if torch.cuda.is_available() else "cpu"


if __name__ == "__main__":
    main()
