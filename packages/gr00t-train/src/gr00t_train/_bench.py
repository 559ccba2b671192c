"""`gr00t-train bench`: the ablation ladder of DESIGN.md section 5 in one process. Every row trains the same
model on the same data and device for the same steps; only the switches differ. Rows are cumulative."""

from __future__ import annotations

import dataclasses
import gc
import json
import logging
import platform
import time
from pathlib import Path
from typing import Any

import torch

from ._config import TrainConfig
from ._config_io import apply_overrides, config_to_dict

log = logging.getLogger(__name__)

LADDER: list[tuple[str, list[str]]] = [
    (
        "baseline",
        [
            "optimizations.data=sync",
            "optimizations.comm=allreduce_after_backward",
            "optimizations.graph=eager",
            "optimizations.fused_optimizer=false",
            "optimizations.tf32=false",
            "optimizations.cudnn_benchmark=false",
        ],
    ),
    ("+ async data", ["optimizations.data=async"]),
    ("+ overlap", ["optimizations.comm=overlap"]),
    ("+ graphs", ["optimizations.graph=per_microbatch"]),
    (
        "+ everything else",
        [
            "optimizations.fused_optimizer=true",
            "optimizations.tf32=true",
            "optimizations.cudnn_benchmark=true",
        ],
    ),
]
"""(row name, the switches it changes on top of the previous row)."""


def ladder_configs(base: TrainConfig, steps: int, warmup: int) -> list[tuple[str, TrainConfig]]:
    """The config of every row: `base` plus the cumulative switches, short runs without checkpoints."""
    common = [
        f"steps={warmup + steps}",
        f"logging.summary_skip={warmup}",
        f"logging.every={max(1, min(10, steps))}",
        "logging.plots=false",
        "logging.tensorboard=false",
        "checkpoint.save_final=false",
        "checkpoint.every=0",
        "checkpoint.resume=none",
        "optim.warmup_ratio=0",
    ]
    rows, switches = [], []
    for index, (name, changes) in enumerate(LADDER):
        switches = switches + changes
        out = f"{base.output_dir}/row{index}"
        rows.append((name, apply_overrides(base, [*common, *switches, f"output_dir={out}"])))
    return rows


def run_ladder(
    base: TrainConfig, *, steps: int, warmup: int, rows: list[int] | None = None
) -> dict[str, Any]:
    """Train every selected row; returns the table as a JSON-ready dict (speedups over the first row run)."""
    from ._build import build_parts
    from ._distributed import init_distributed, shutdown_distributed
    from ._run import share_cpu_cores
    from ._trainer import Trainer

    env = init_distributed(base.device)
    results = []
    try:
        for index, (name, cfg) in enumerate(ladder_configs(base, steps, warmup)):
            if rows is not None and index not in rows:
                continue
            log.info("ablation row %d: %s", index, name)
            started = time.perf_counter()
            if env.device.type == "cpu":
                share_cpu_cores(cfg)
            parts = build_parts(cfg, env)
            trainer = Trainer(cfg, parts, env)
            summary = trainer.fit()
            report = trainer.graphed_step.report
            results.append(
                {
                    "row": name,
                    "switches": dataclasses.asdict(cfg.optimizations),
                    "samples_per_s": summary.samples_per_s,
                    "tokens_per_s": summary.tokens_per_s,
                    "mfu": summary.mfu,
                    "step_time_ms": 1000 * summary.step_time_s,
                    "breakdown_ms": {k: 1000 * v for k, v in summary.breakdown_s.items()},
                    "first_loss": summary.first_loss,
                    "final_loss": summary.final_loss,
                    "graph_backend": report.backend,
                    "capture_s": report.capture_seconds,
                    "row_wall_s": time.perf_counter() - started,
                }
            )
            del trainer, parts
            _free_device_memory(env.device)
    finally:
        shutdown_distributed(env)
    base_rate = results[0]["samples_per_s"] if results else 0.0
    for row in results:
        row["speedup"] = row["samples_per_s"] / base_rate if base_rate else None
    return {
        "setting": config_to_dict(base),
        "steps": steps,
        "warmup": warmup,
        "device": torch.cuda.get_device_name(env.device)
        if env.device.type == "cuda"
        else platform.processor() or "cpu",
        "world_size": env.world_size,
        "torch": torch.__version__,
        "date": time.strftime("%Y-%m-%d %H:%M"),
        "rows": results,
    }


def _free_device_memory(device: torch.device) -> None:
    gc.collect()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        torch.cuda.empty_cache()


def format_table(result: dict[str, Any]) -> str:
    """The ladder as a text table."""
    header = f"{'row':<20}{'samples/s':>11}{'tokens/s':>12}{'MFU':>8}{'step ms':>10}{'data wait':>11}{'speedup':>9}"
    lines = [header, "-" * len(header)]
    for r in result["rows"]:
        tokens = "n/a" if r["tokens_per_s"] is None else f"{r['tokens_per_s']:,.0f}"
        mfu = "n/a" if r["mfu"] is None else f"{100 * r['mfu']:.1f}%"
        lines.append(
            f"{r['row']:<20}{r['samples_per_s']:>11.2f}{tokens:>12}{mfu:>8}{r['step_time_ms']:>10.1f}"
            f"{r['breakdown_ms']['data_wait']:>11.1f}{r['speedup']:>8.2f}x"
        )
    return "\n".join(lines)


def write_json(result: dict[str, Any], path: str | Path) -> None:
    """Write the result as JSON."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(result, indent=2) + "\n")
