"""The plain `gr00t-train train` against the ablation ladder's last exact row, and what validation costs.

Each variant runs in its own process on the same dataset and GPU:

    plain          gr00t-train train --set data.dataset=D --set data.cameras=image,wrist_image (every other
                   setting at its default) with validation every `--eval-every` steps to time it
    plain-eval-compiled   the same, validation running the compiled blocks (EVAL_STANCE="default")
    ladder         gr00t-train bench --rows <the last exact row> on the same defaults

It prints samples/s, MFU, the first step's seconds (compilation, capture), the seconds of each validation,
and what validation costs at the default cadence (eval.every=500): one validation against 500 steps.

    python -m vla_io synth /tmp/libero --preset libero --episodes 10
    PYTHONPATH=$(ls -d $PWD/packages/*/src | tr '\\n' ':') python benchmarks/default_path.py \\
        --dataset /tmp/libero --json benchmarks/results/default_path_h200_<date>.json
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

RUN = """
import sys
import gr00t_train.validation.component as validation
from gr00t_train.cli import main
validation.EVAL_STANCE = {stance!r}
sys.exit(main({argv!r}))
"""


def parse() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--dataset", type=Path, required=True)
    p.add_argument("--cameras", default="image,wrist_image")
    p.add_argument("--steps", type=int, default=60, help="steps of each plain run (ladder: steps - warmup)")
    p.add_argument("--warmup", type=int, default=6, help="leading steps left out of samples/s")
    p.add_argument("--eval-every", type=int, default=20)
    p.add_argument("--variants", default="plain,plain-eval-compiled,ladder")
    p.add_argument("--out", type=Path, default=Path("/tmp/default_path"))
    p.add_argument("--json", type=Path)
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                   help="more settings for every variant (e.g. model.preset=tiny for a quick CPU check)")  # fmt: skip
    return p.parse_args()


def _train(args: argparse.Namespace, name: str, stance: str) -> dict:
    out = args.out / name
    argv = ["train", "--overwrite"]
    for item in (
        f"data.dataset={args.dataset}",
        f"data.cameras={args.cameras}",
        "data.val_episodes=1",
        f"steps={args.steps}",
        f"eval.every={args.eval_every}",
        f"output_dir={out}",
        f"logging.summary_skip={args.warmup}",
        "logging.progress=false",
        "checkpoint.save_final=false",
        *args.overrides,
    ):
        argv += ["--set", item]
    started = time.perf_counter()
    proc = subprocess.run(
        [sys.executable, "-c", RUN.format(stance=stance, argv=argv)], capture_output=True, text=True
    )
    if proc.returncode != 0:
        raise SystemExit(f"{name} failed ({proc.returncode}):\n{proc.stderr[-4000:]}")
    summary = json.loads((out / "summary.json").read_text())
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    val = [r for r in rows if r.get("kind") == "val"]
    startup = [line for line in proc.stderr.splitlines() if "optimizations on" in line]
    return {
        "variant": name,
        "eval_stance": stance,
        "samples_per_s": summary["samples_per_s"],
        "mfu": summary["mfu"],
        "step_ms": 1000 * summary["step_time_s"],
        "first_step_s": summary["first_step_s"],
        "peak_memory_gib": summary["peak_memory_gib"],
        "validation_s": [r["seconds"] for r in val],
        "validation_ratio": [r.get("ratio") for r in val],
        "process_s": time.perf_counter() - started,
        "startup_line": startup[-1].split(": ", 1)[-1] if startup else None,
    }


def _ladder(args: argparse.Namespace) -> dict:
    from gr00t_train._bench import LADDER

    row = max(i for i, (name, _) in enumerate(LADDER) if "stretch" not in name)
    out = args.out / "ladder.json"
    argv = ["bench", "--rows", str(row), "--steps", str(args.steps - args.warmup), "--warmup", str(args.warmup),
            "--set", f"data.dataset={args.dataset}", "--set", f"data.cameras={args.cameras}",
            "--set", f"output_dir={args.out / 'ladder'}", "--set", "logging.progress=false", "--json", str(out)]  # fmt: skip
    for item in args.overrides:
        argv += ["--set", item]
    proc = subprocess.run([sys.executable, "-m", "gr00t_train", *argv], capture_output=True, text=True)
    if proc.returncode != 0:
        raise SystemExit(f"ladder failed ({proc.returncode}):\n{proc.stderr[-4000:]}")
    result = json.loads(out.read_text())
    (measured,) = [r for r in result["rows"] if r.get("samples_per_s")]
    return {"variant": f"ladder row {row} ({LADDER[row][0]})", "samples_per_s": measured["samples_per_s"],
            "mfu": measured.get("mfu"), "step_ms": measured.get("step_time_ms")}  # fmt: skip


def main() -> None:
    args = parse()
    args.out.mkdir(parents=True, exist_ok=True)
    results = []
    for name in args.variants.split(","):
        if name == "ladder":
            results.append(_ladder(args))
        else:
            results.append(_train(args, name, "default" if name.endswith("compiled") else "force_eager"))
        print(json.dumps(results[-1]), flush=True)
    print(f"\n{'variant':<48} {'samples/s':>9} {'MFU':>6} {'step ms':>8}  validations (s), cost at every 500")
    for r in results:
        vals = r.get("validation_s") or []
        cost = ""
        if vals:
            later = vals[1:] or vals  # the first one may include one-off work
            per = sum(later) / len(later)
            cost = f"{', '.join(f'{v:.2f}' for v in vals)}; {100 * per / (500 * r['step_ms'] / 1000):.2f}%"
        mfu = r.get("mfu") or 0.0
        print(
            f"{r['variant']:<48} {r['samples_per_s']:>9.1f} {100 * mfu:>5.1f}% {r.get('step_ms') or 0:>8.2f}  {cost}"
        )
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(
            json.dumps({"date": time.strftime("%Y-%m-%d"), "results": results}, indent=2) + "\n"
        )


if __name__ == "__main__":
    main()
