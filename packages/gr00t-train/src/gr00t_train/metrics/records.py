"""Per-step metrics: a JSONL line per step, TensorBoard scalars when installed, a progress bar with loss,
samples/s and ETA, and the end-of-run summary. Validations (`validation/component.py`) add their own lines
to metrics.jsonl, told apart by `"kind": "val"` (step lines carry no `kind`), and `val/...` scalars."""

from __future__ import annotations

import json
import logging
import math
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from ..validation.held_out import score_line
from .timing import PHASES

log = logging.getLogger(__name__)

KNOWN_PEAK_TFLOPS = {"H100": 989.0, "H200": 989.0, "H800": 989.0, "H20": 148.0, "A100": 312.0, "A800": 312.0}
"""Datasheet dense bf16 peak per GPU (TFLOP/s): the denominator of MFU as torchtitan, Megatron and
llm-foundry count it (a measured matmul rate, about 790 on an H200, may be shown beside it, never instead)."""


@dataclass
class StepRecord:
    """What one optimizer step did and how long it took (per process; loss averaged over ranks)."""

    step: int
    loss: float
    lr: float
    grad_norm: float | None
    step_time_s: float
    samples_per_s: float
    tokens_per_s: float | None
    mfu: float | None
    data_wait_s: float
    h2d_s: float
    compute_s: float
    comm_s: float
    optimizer_s: float
    optimizer_overlapped_s: float = 0.0
    between_steps_s: float = 0.0
    """Since the previous step of the session ended (`StepTimer.begin_step`); not part of step_time_s."""


@dataclass
class Throughput:
    """How to turn a step time into samples/s, tokens/s and MFU."""

    samples_per_step: int
    tokens_per_sample: float | None = None
    flops_per_sample: float | None = None
    peak_flops: float | None = None

    def record(self, step: int, loss: float, lr: float, grad_norm: float | None, times: dict) -> StepRecord:
        """A StepRecord from resolved phase times."""
        dt = max(times["step"], 1e-12)
        sps = self.samples_per_step / dt
        tokens = sps * self.tokens_per_sample if self.tokens_per_sample else None
        mfu = (
            sps * self.flops_per_sample / self.peak_flops
            if self.flops_per_sample and self.peak_flops
            else None
        )
        phases = {f"{name}_s": times[name] for name in PHASES}
        between = times.get("between_steps", 0.0)
        return StepRecord(step, loss, lr, grad_norm, dt, sps, tokens, mfu, **phases, between_steps_s=between)


def peak_flops_for(device_name: str, override_tflops: float | None) -> float | None:
    """Peak FLOP/s of a device for MFU: the configured value, else a known GPU's datasheet dense bf16 peak."""
    if override_tflops is not None:
        return override_tflops * 1e12
    for key, tflops in KNOWN_PEAK_TFLOPS.items():
        if key in device_name:
            return tflops * 1e12
    return None


@dataclass
class RunSummary:
    """Averages over the measured steps of a run (leading steps skipped)."""

    steps: int
    measured_steps: int
    first_loss: float
    """Mean loss of the first 10 steps (of the first half in a run of fewer than 20)."""
    final_loss: float
    """Mean loss of the last 10 steps (of the last half in a run of fewer than 20)."""
    samples_per_s: float
    tokens_per_s: float | None
    mfu: float | None
    step_time_s: float
    breakdown_s: dict[str, float] = field(default_factory=dict)
    """Where a step's time went (sums to step_time_s): data_wait, compute, comm, optimizer, other."""
    h2d_s: float = 0.0
    """Host-to-device copy + device transform per step, on the pipeline's own thread (overlapped)."""
    optimizer_overlapped_s: float = 0.0
    """GPU time of the optimizer step on its side stream, overlapping the next step (optimizer_overlap)."""
    between_steps_s: float = 0.0
    """Seconds between the session's steps, all of them (on CUDA: the device idle, waiting for the loop's
    host work: saves' stalls, validations, log flushes, a host fallen behind); apart from step_time_s."""
    skipped_samples: int = 0
    """Samples whose video could not be read (decode error, another frame size, missing frames), replaced by others (all ranks, the whole run)."""
    validation: dict[str, Any] | None = None
    """The session's last validation (eval.every on the held-out episodes): step, samples, and overall and
    per joint group (`groups`) the model's MSE, the mean-action baseline's MSE and their ratio (normalized
    scale; ratio < 1: better than the mean); None when none ran."""
    validation_s: float = 0.0
    """Wall seconds the session spent validating (device synchronized), every validation together."""
    validation_share: float = 0.0
    """validation_s as a fraction of the session's wall time (from the start of its loop to its summary)."""

    def add_validation(self, records: list[dict[str, Any]], wall_s: float) -> None:
        """The session's validations (metrics.jsonl's val records) and its wall seconds."""
        self.validation = records[-1] if records else None
        self.validation_s = sum(r["seconds"] for r in records)
        self.validation_share = self.validation_s / wall_s if wall_s > 0 else 0.0

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready fields."""
        return asdict(self)

    def table(self) -> str:
        """A small text table for the terminal."""
        rows = [
            ("steps", f"{self.steps} ({self.measured_steps} measured)"),
            ("loss", f"{self.first_loss:.4f} -> {self.final_loss:.4f}"),
            ("samples/s", f"{self.samples_per_s:.2f}"),
            ("tokens/s", "n/a" if self.tokens_per_s is None else f"{self.tokens_per_s:,.0f}"),
            ("MFU", "n/a" if self.mfu is None else f"{100 * self.mfu:.1f}%"),
            ("step time", f"{1000 * self.step_time_s:.1f} ms"),
        ]
        total = max(self.step_time_s, 1e-12)
        for name, seconds in self.breakdown_s.items():
            rows.append((f"  {name}", f"{1000 * seconds:.1f} ms ({100 * seconds / total:.0f}%)"))
        rows.append(("h2d (overlapped)", f"{1000 * self.h2d_s:.1f} ms"))
        if self.optimizer_overlapped_s:
            rows.append(("optimizer (overlapped)", f"{1000 * self.optimizer_overlapped_s:.1f} ms"))
        rows.append(("skipped samples", f"{self.skipped_samples} (unreadable video)"))
        if self.validation is not None:
            rows.append((
                f"validation (step {self.validation['step']})",
                f"{score_line(self.validation)}; {self.validation_s:.1f} s in all, "
                f"{100 * self.validation_share:.1f}% of the session",
            ))  # fmt: skip
        width = max(len(k) for k, _ in rows)
        return "\n".join(f"{k.ljust(width)}  {v}" for k, v in rows)


def summarize(records: list[StepRecord], skip: int, throughput: Throughput) -> RunSummary:
    """Throughput over all but the first `skip` records (all of them if fewer), losses over all."""
    if not records:
        raise ValueError("no steps were recorded")
    measured = records[skip:] if len(records) > skip else records
    n = len(measured)
    window = max(1, min(10, len(records) // 2))  # short runs: halves, so first and final never coincide
    step_time = sum(r.step_time_s for r in measured) / n
    rates = throughput.record(0, 0.0, 0.0, None, {"step": step_time, **dict.fromkeys(PHASES, 0.0)})
    in_step = [name for name in PHASES if name not in ("h2d", "optimizer_overlapped")]
    breakdown = {name: sum(getattr(r, f"{name}_s") for r in measured) / n for name in in_step}
    breakdown["other"] = max(0.0, step_time - sum(breakdown.values()))
    return RunSummary(
        steps=records[-1].step,
        measured_steps=n,
        first_loss=_mean([r.loss for r in records[:window]]),
        final_loss=_mean([r.loss for r in records[-window:]]),
        samples_per_s=rates.samples_per_s,
        tokens_per_s=rates.tokens_per_s,
        mfu=rates.mfu,
        step_time_s=step_time,
        breakdown_s=breakdown,
        h2d_s=sum(r.h2d_s for r in measured) / n,
        optimizer_overlapped_s=sum(r.optimizer_overlapped_s for r in measured) / n,
        between_steps_s=sum(r.between_steps_s for r in records),
    )


def _mean(values: list[float]) -> float:
    return sum(values) / len(values)


class MetricsLogger:
    """Writes records as they are flushed: JSONL, TensorBoard, progress bar (main process only)."""

    def __init__(
        self,
        out_dir: str | Path,
        *,
        total_steps: int,
        start_step: int,
        enabled: bool,
        progress: bool,
        tensorboard: bool,
    ) -> None:
        self.records: list[StepRecord] = []
        self.enabled = enabled
        self._val_ratio: float | None = None
        self.out_dir = Path(out_dir)
        self._jsonl = None
        self._tb = None
        self._bar = None
        if not enabled:
            return
        self.out_dir.mkdir(parents=True, exist_ok=True)
        if start_step:  # a resume: steps logged after the checkpoint are run again, so drop them here
            _truncate_history(self.out_dir / "metrics.jsonl", start_step)
        self._jsonl = open(self.out_dir / "metrics.jsonl", "a" if start_step else "w")  # noqa: SIM115
        if tensorboard:
            self._tb = _tensorboard_writer(self.out_dir / "tensorboard")
        if progress:
            from tqdm.auto import tqdm

            self._bar = tqdm(total=total_steps, initial=start_step, unit="step", dynamic_ncols=True)

    def log(self, records: list[StepRecord]) -> None:
        """Record a flushed window of steps."""
        self.records.extend(records)
        if not self.enabled or not records:
            return
        rows = [asdict(r) for r in records]
        for row in rows:
            self._jsonl.write(json.dumps(_finite(row)) + "\n")
        self._jsonl.flush()
        # a point per key and window: a point per step (14 x 50 calls) took 49-110 ms a window
        if self._tb is not None:
            for key, value in _window_means(rows).items():
                self._tb.add_scalar(f"train/{key}", value, records[-1].step)
        if self._bar is not None:
            last = records[-1]
            shown = {"loss": f"{last.loss:.4f}", "samples_s": f"{last.samples_per_s:.1f}"}
            if self._val_ratio is not None:  # the last validation's MSE over the mean baseline's
                shown["val_ratio"] = f"{self._val_ratio:.3g}"
            self._bar.set_postfix(shown, refresh=False)
            self._bar.update(last.step - self._bar.n)

    def log_validation(self, record: dict[str, Any]) -> None:
        """Record a validation (`"kind": "val"`): a JSONL line and `val/...` TensorBoard scalars (a mixture's
        members under `val/<member>/...`)."""
        self._val_ratio = record["ratio"]
        if not self.enabled:
            return
        self._jsonl.write(json.dumps(_finite(record)) + "\n")
        self._jsonl.flush()
        if self._tb is not None:
            step = record["step"]
            for name in ("mse", "baseline", "ratio"):
                self._tb.add_scalar(f"val/{name}", record[name], step)
                for group, scores in record["groups"].items():
                    self._tb.add_scalar(f"val/{group}/{name}", scores[name], step)
                for member, scores in record.get("members", {}).items():  # a mixture: each dataset's own
                    self._tb.add_scalar(f"val/{member}/{name}", scores[name], step)
                    for group, group_scores in scores["groups"].items():
                        self._tb.add_scalar(f"val/{member}/{group}/{name}", group_scores[name], step)

    def close(self) -> None:
        """Flush and close outputs."""
        if self._bar is not None:
            self._bar.close()
        if self._jsonl is not None:
            self._jsonl.close()
        if self._tb is not None:
            self._tb.close()


def _window_means(rows: list[dict[str, Any]]) -> dict[str, float]:
    """What TensorBoard gets of a logging window: each field's mean over its steps (the learning rate: the
    last step's), as a loss logged per interval is its mean; metrics.jsonl keeps every step."""
    means = {}
    for key in (key for key in rows[-1] if key != "step"):  # in the record's field order
        values = [row[key] for row in rows if row[key] is not None]
        if values:
            means[key] = values[-1] if key == "lr" else sum(values) / len(values)
    return means


def _truncate_history(path: Path, last_step: int) -> None:
    """Keep only the lines of steps <= last_step, step and validation lines alike (and nothing torn by a kill
    mid-write)."""
    if not path.is_file():
        return
    kept = []
    for line in path.read_text().splitlines():
        try:
            if int(json.loads(line)["step"]) <= last_step:
                kept.append(line)
        except (ValueError, KeyError, TypeError):
            continue
    tmp = path.with_suffix(".jsonl.tmp")
    tmp.write_text("".join(f"{line}\n" for line in kept))
    tmp.replace(path)


def _finite(row: dict[str, Any]) -> dict[str, Any]:
    # JSON has no NaN/inf; write them as strings so every line stays valid JSON.
    return {k: _finite_value(v) for k, v in row.items()}


def _finite_value(value: Any) -> Any:
    if isinstance(value, dict):
        return _finite(value)
    return str(value) if isinstance(value, float) and not math.isfinite(value) else value


def _tensorboard_writer(path: Path):
    try:
        from torch.utils.tensorboard import SummaryWriter
    except ImportError:
        log.info(
            "tensorboard is not installed; skipping TensorBoard logs (pip install gr00t-train[tensorboard])"
        )
        return None
    return SummaryWriter(str(path))
