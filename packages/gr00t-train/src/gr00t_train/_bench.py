"""`gr00t-train bench`: the ablation ladder (docs/architecture.md, "The speed switches"; results in
BENCHMARKS.md) in one process. Every row trains the same
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

from .config.io import apply_overrides, config_to_dict
from .config.sections import TrainConfig

log = logging.getLogger(__name__)

LADDER: list[tuple[str, list[str]]] = [
    (
        "baseline (LeRobot-style)",
        [
            "optimizations.data=dataloader",
            "optimizations.comm=ddp",
            "optimizations.graph=eager",
            "optimizations.compile=off",
            "optimizations.fused_optimizer=false",
            "optimizations.bf16_weights=false",
            "optimizations.optimizer_overlap=false",
            "optimizations.flat_optimizer=off",
            "optimizations.grouped_embodiment_gemms=off",
            "optimizations.skip_untouched_rows=false",
            "optimizations.param_remainders=false",
            "optimizations.triton_attention=off",
            "optimizations.merged_dit_linears=off",
            "optimizations.staged_update=false",
            "optimizations.tf32=true",
            "optimizations.cudnn_benchmark=true",
        ],
    ),
    ("+ vla-io pipeline", ["optimizations.data=async"]),
    ("+ overlap", ["optimizations.comm=overlap"]),
    ("+ fused AdamW", ["optimizations.fused_optimizer=true"]),
    ("+ CUDA graphs", ["optimizations.graph=per_microbatch"]),
    ("+ compiled blocks", ["optimizations.compile=on"]),
    ("+ bf16 weights", ["optimizations.comm=zero1_overlap", "optimizations.bf16_weights=true"]),
    ("+ optimizer overlap", ["optimizations.optimizer_overlap=true"]),
    # auto: the Triton kernel on CUDA; on a CPU (no Triton step) this row repeats the one before
    ("+ one-pass optimizer kernel", ["optimizations.flat_optimizer=auto"]),
    # auto: on with CUDA; on a CPU this row repeats the one before
    ("+ grouped embodiment GEMMs", ["optimizations.grouped_embodiment_gemms=auto"]),
    # exact: rows of the embodiment tables that no batch touched only decay (one embodiment: 31 of 32 slots)
    ("+ untouched table rows skipped", ["optimizations.skip_untouched_rows=true"]),
    # masters as bf16 weight + 16-bit remainder: a tie moves one fp32 ulp (on a CPU: repeats the row before)
    ("+ master remainders", ["optimizations.param_remainders=true"]),
    # auto: on with CUDA; on a CPU this row repeats the one before
    ("+ Triton DiT attention", ["optimizations.triton_attention=auto"]),
    # auto: on with CUDA; on a CPU this row repeats the one before
    ("+ merged DiT linears", ["optimizations.merged_dit_linears=auto"]),
    # each trainable block waits only for its own stage of the update (one GPU, flat step): the same numbers
    ("+ staged update", ["optimizations.staged_update=true"]),
    # the stretch row: FP8 GEMMs for the frozen prefix change the numerics (its own loss-parity run)
    ("+ FP8 frozen prefix (stretch)", ["optimizations.fp8_frozen=true"]),
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
        "eval.every=0",  # rows time the step; validation has its own cost line in a run's summary
    ]
    rows, switches = [], []
    for index, (name, changes) in enumerate(LADDER):
        switches = switches + changes
        out = f"{base.output_dir}/row{index}"
        rows.append((name, apply_overrides(base, [*common, *switches, f"output_dir={out}"])))
    return rows


def run_ladder(
    base: TrainConfig,
    *,
    steps: int,
    warmup: int,
    rows: list[int] | None = None,
    profile: bool = True,
    baseline_runs: int = 1,
) -> dict[str, Any]:
    """Train every selected row; returns the table as a JSON-ready dict (speedups over the first row run).
    With `profile`, the last row's GPU kernel time by family over 3 extra steps is added. The first row runs
    `baseline_runs` times (the baseline is host-bound and varies between runs): it reports the run of
    median samples/s, every run's samples/s in `samples_per_s_runs`."""
    from ._backends import request_zero_gemm_workspace
    from ._distributed import init_distributed, shutdown_distributed

    if baseline_runs < 1:
        raise ValueError(f"baseline_runs must be >= 1, got {baseline_runs}")
    configs = ladder_configs(base, steps, warmup)
    selected = [i for i in range(len(configs)) if rows is None or i in rows]
    # torch 2.11 reads cuBLAS's workspace size once per process: the last row's choice then holds for
    # every row (no workspace: the same or faster kernels than the default's, BENCHMARKS.md, levers tried).
    # Torch with a runtime setter gives each row its own.
    take_out_workspace_env = request_zero_gemm_workspace(configs[selected[-1]][1]) if selected else None
    env = init_distributed(base.device)
    results = []
    try:
        for index in selected:
            name, cfg = configs[index]
            last = profile and index == selected[-1] and env.device.type == "cuda"
            repeats = [cfg] + [  # each repeat in a folder of its own
                apply_overrides(cfg, [f"output_dir={cfg.output_dir}-run{k}"])
                for k in range(2, (baseline_runs if index == 0 else 1) + 1)
            ]
            runs = [_run_row(name, each, env, steps, warmup, last) for each in repeats]
            row = sorted(runs, key=lambda r: r["samples_per_s"])[(len(runs) - 1) // 2]
            if len(runs) > 1:
                row["samples_per_s_runs"] = [r["samples_per_s"] for r in runs]
            results.append(row)
    finally:
        shutdown_distributed(env)
        if take_out_workspace_env is not None:
            take_out_workspace_env()
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


def _run_row(name: str, cfg: TrainConfig, env, steps: int, warmup: int, last: bool) -> dict[str, Any]:
    """Train one row; with `last`, three more steps recorded by the profiler after the measured ones."""
    from ._run import share_cpu_cores
    from ._trainer import Trainer
    from .model.build import build_parts

    if last:
        cfg = apply_overrides(cfg, [f"steps={warmup + steps + 3}"])
    log.info("ablation row: %s", name)
    started = time.perf_counter()
    if env.device.type == "cpu":
        share_cpu_cores(cfg)
    if env.device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(env.device)
    parts = build_parts(cfg, env)
    trainer = Trainer(cfg, parts, env)
    kernels = None
    if last:
        from .metrics.profile import profile_steps

        _, kernels = profile_steps(trainer, skip=warmup + steps, active=3)
    if kernels is None:
        summary = trainer.fit()
    else:  # the throughput of the measured steps only, not of the profiled ones after them
        from .metrics.component import read_history
        from .metrics.records import summarize

        history = read_history(Path(cfg.output_dir) / "metrics.jsonl")[: warmup + steps]
        summary = summarize(history, warmup, trainer.throughput)
    row = {
        "row": name,
        "switches": dataclasses.asdict(trainer.cfg.optimizations),  # as they ran (auto resolved)
        "samples_per_s": summary.samples_per_s,
        "tokens_per_s": summary.tokens_per_s,
        "mfu": summary.mfu,
        "step_time_ms": 1000 * summary.step_time_s,
        "breakdown_ms": {k: 1000 * v for k, v in summary.breakdown_s.items()},
        "optimizer_overlapped_ms": 1000 * summary.optimizer_overlapped_s,
        "first_loss": summary.first_loss,
        "final_loss": summary.final_loss,
        **trainer.run_facts(),
        "row_wall_s": time.perf_counter() - started,
        **({"kernel_families_ms": kernels} if kernels is not None else {}),
    }
    if hasattr(parts.model, "uncompile_blocks"):
        parts.model.uncompile_blocks()  # compiled forwards hold their blocks: let the model go
    del trainer, parts
    _free_device_memory(env.device)
    return row


def _free_device_memory(device: torch.device) -> None:
    gc.collect()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        torch.cuda.empty_cache()


def format_table(result: dict[str, Any]) -> str:
    """The ladder as a text table (MFU against the datasheet dense bf16 peak of the GPU)."""
    header = (f"{'row':<26}{'samples/s':>10}{'MFU':>7}{'step ms':>9}{'data wait':>10}{'optim':>7}"
              f"{'start s':>8}{'mem GiB':>8}{'loss':>8}{'speedup':>8}")  # fmt: skip
    lines = [header, "-" * len(header)]
    for r in result["rows"]:
        mfu = "n/a" if r["mfu"] is None else f"{100 * r['mfu']:.1f}%"
        runs = r.get("samples_per_s_runs")
        memory = "n/a" if r.get("peak_memory_gib") is None else f"{r['peak_memory_gib']:.1f}"
        optim = r["breakdown_ms"]["optimizer"] or r.get("optimizer_overlapped_ms", 0.0)
        lines.append(
            f"{r['row']:<26}{r['samples_per_s']:>10.1f}{mfu:>7}{r['step_time_ms']:>9.1f}"
            f"{r['breakdown_ms']['data_wait']:>10.1f}{optim:>7.1f}{r['first_step_s'] or 0:>8.1f}{memory:>8}"
            f"{r['final_loss']:>8.4f}{r['speedup']:>7.2f}x"
            + (f"  (median of {len(runs)} runs: {', '.join(f'{v:.1f}' for v in runs)})" if runs else "")
        )
    if result["rows"] and result["rows"][-1].get("peak_tflops"):
        lines.append(
            f"MFU against {result['rows'][-1]['peak_tflops']:.0f} TFLOP/s per GPU (datasheet dense bf16)"
        )
    return "\n".join(lines)


def write_json(result: dict[str, Any], path: str | Path) -> None:
    """Write the result as JSON."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(result, indent=2) + "\n")
