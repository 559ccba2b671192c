"""The metrics component: what the loop records per step and reports per run.

Each step's loss, gradient norm and phase times stay on the device (`add_step`); every `logging.every` steps
`flush` reads the whole window: the loss averaged over ranks, a non-finite loss named with the samples that
hold NaN/inf, and one StepRecord per step written to metrics.jsonl, TensorBoard and the progress bar
(`MetricsLogger`, `metrics/records.py`). A plain flush only issues the window's copies to the host, on a
stream of its own, and `finish` (after the next step is launched) logs them: the device runs that step while
the host waits and writes, instead of idling until the host launches again. Before a checkpoint, a
validation, a stop and at the last step `flush(wait=True)` logs at once. Validations (`validation.py`)
are recorded beside them (`add_validation`). At the end, the summary, summary.json and the plots."""

from __future__ import annotations

import json
import logging
import math
import time
from collections.abc import Callable
from contextlib import nullcontext
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from .._distributed import DistEnv
from .._errors import NonFiniteLossError
from .._parts import Batch, TrainParts, episode_ids
from .._run_checks import SampleTags, describe_nonfinite, tag_samples
from ..config.sections import TrainConfig
from .records import MetricsLogger, RunSummary, StepRecord, Throughput, peak_flops_for, summarize
from .timing import LapClock, StepTimer, StepTimes

log = logging.getLogger(__name__)


@dataclass
class _Pending:
    """A finished step whose loss and timings are still on the device."""

    step: int
    loss: torch.Tensor
    grad_norm: torch.Tensor
    lr: float
    episode_index: list[Any]
    times: StepTimes
    samples: list[SampleTags]


@dataclass
class _WindowRead:
    """A flushed window on its way to the host: its rank-mean losses, own losses and grad norms as rows of
    `values` (pinned host memory on CUDA, copied on the read stream), there once `ready` is."""

    pending: list[_Pending]
    values: torch.Tensor
    ready: torch.cuda.Event | None


class MetricsComponent:
    """Step records from the step timer, their host sync per window, logs, summary and report."""

    def __init__(
        self, cfg: TrainConfig, env: DistEnv, parts: TrainParts, global_batch: int, timer: StepTimer
    ) -> None:
        self.cfg, self.env = cfg, env
        self.timer, self.global_batch = timer, global_batch
        self.out_dir = Path(cfg.output_dir)
        device_name = torch.cuda.get_device_name(env.device) if env.device.type == "cuda" else "cpu"
        peak = peak_flops_for(device_name, cfg.logging.peak_tflops)
        self.peak_tflops = None if peak is None else peak / 1e12
        """The MFU denominator per device (TFLOP/s), None when unknown."""
        if peak is not None:
            log.info("MFU counts against %.0f TFLOP/s per %s (%s)", self.peak_tflops, device_name,
                     "logging.peak_tflops" if cfg.logging.peak_tflops else "datasheet dense bf16 peak")  # fmt: skip
        self.throughput = Throughput(  # the global batch's FLOPs against the peak of every rank's device
            global_batch,
            parts.tokens_per_sample,
            parts.flops_per_sample,
            None if peak is None else peak * env.world_size,
        )
        self._pending: list[_Pending] = []
        self._reading: _WindowRead | None = None
        # the window's copies wait there for its last step and the update, not holding up the compute stream
        self._stream = torch.cuda.Stream(env.device) if env.device.type == "cuda" else None
        self._logger: MetricsLogger | None = None
        self.validations: list[dict[str, Any]] = []
        """This session's validation records (metrics.jsonl's `"kind": "val"` lines)."""
        self._opened = time.perf_counter()

    def open(self, start_step: int) -> None:
        """Start logging a session that begins after `start_step` (a resume drops later lines)."""
        self._pending, self.validations, self._reading = [], [], None
        self._opened = time.perf_counter()  # the session's wall time, validation's share of it
        self._logger = MetricsLogger(
            self.out_dir,
            total_steps=self.cfg.steps,
            start_step=start_step,
            enabled=self.env.is_main,
            progress=self.cfg.logging.progress,
            tensorboard=self.cfg.logging.tensorboard,
        )

    @property
    def records(self) -> list[StepRecord]:
        """The steps of this session flushed so far."""
        return self._logger.records if self._logger is not None else []

    def add_step(
        self, step: int, loss: torch.Tensor, grad_norm: torch.Tensor, lr: float, microbatches: list[Batch]
    ) -> None:
        """Keep a finished step (values on the device; per-sample NaN/inf flags computed there) and end its
        timing."""
        ids = [b.get("episode_index") for b in microbatches]
        tags = [tag_samples(b) for b in microbatches]
        self._pending.append(_Pending(step, loss, grad_norm, lr, ids, self.timer.end_step(), tags))

    @property
    def reading(self) -> bool:
        """A flushed window is on its way to the host (`finish` logs it)."""
        return self._reading is not None

    def flush(self, clock: LapClock, fence: Callable[[], None], *, wait: bool) -> None:
        """Read the window of pending steps: its losses averaged over ranks and grad norms, copied to the
        host behind `fence` (which makes the current stream wait for the update that computes the norms).
        With `wait` the window is logged now; else `finish` logs it, once the next step is launched. A window
        still in flight is logged first. `clock` gets the parts as laps: `flush_issue`, then `finish`'s."""
        self.finish(clock)
        pending, self._pending = self._pending, []
        if pending:
            self._reading = self._read(pending, fence)
            clock.lap("flush_issue")
        if wait:
            self.finish(clock)

    def finish(self, clock: LapClock) -> None:
        """Log the window in flight, if any: wait for its values (`flush_device_sync`), check them and make
        its records (`flush_records`), write them (`flush_log`)."""
        read, self._reading = self._reading, None
        if read is None:
            return
        if read.ready is not None:
            read.ready.synchronize()
        global_loss, local, norms = read.values.tolist()
        clock.lap("flush_device_sync")
        records = self._records(read.pending, global_loss, local, norms)
        clock.lap("flush_records")
        self._logger.log(records)
        clock.lap("flush_log")

    def _read(self, pending: list[_Pending], fence: Callable[[], None]) -> _WindowRead:
        stream = self._stream
        if stream is not None:
            stream.wait_stream(torch.cuda.current_stream(self.env.device))  # the window's last step
        with torch.cuda.stream(stream) if stream is not None else nullcontext():
            fence()
            local = torch.stack([p.loss for p in pending]).float()
            global_loss = self.env.all_reduce_mean(local.clone())
            norms = torch.stack([p.grad_norm.float() for p in pending])
            values = torch.stack([global_loss, local, norms])
            if stream is None:
                return _WindowRead(pending, values, None)
            host = torch.empty(values.shape, dtype=values.dtype, pin_memory=True)
            host.copy_(values, non_blocking=True)
            ready = torch.cuda.Event()
            ready.record(stream)
        # `pending` keeps the device tensors alive until `ready`: nothing reuses them while the copy reads
        return _WindowRead(pending, host, ready)

    def add_validation(self, record: dict[str, Any]) -> None:
        """A validation's record (every rank has it; rank 0 writes it): metrics.jsonl, TensorBoard, the
        progress bar, and the summary's last validation."""
        self.validations.append(record)
        self._logger.log_validation(record)

    def _records(
        self, pending: list[_Pending], global_loss: list[float], local: list[float], norms: list[float]
    ) -> list[StepRecord]:
        for p, value, mine in zip(pending, global_loss, local):
            if not math.isfinite(value):  # every rank sees the same global value: all of them come here
                bad_ranks = self._nonfinite_ranks(mine)
                if math.isfinite(mine):  # another rank's batch: that rank names it
                    raise NonFiniteLossError(p.step, value, None, self.env.rank, bad_ranks=bad_ranks)
                where, checked = describe_nonfinite(p.samples)
                raise NonFiniteLossError(
                    p.step, mine, _flat_ids(p.episode_index), self.env.rank, where,
                    inputs_finite=checked and where is None, bad_ranks=bad_ranks,
                )  # fmt: skip
        return [
            self.throughput.record(p.step, loss, p.lr, norm, p.times.seconds())
            for p, loss, norm in zip(pending, global_loss, norms)
        ]

    def _nonfinite_ranks(self, mine: float) -> list[int]:
        """The ranks whose own loss is non-finite (one small all-reduce, on the error path only)."""
        if self.env.world_size == 1:
            return [] if math.isfinite(mine) else [self.env.rank]
        flags = torch.zeros(self.env.world_size, dtype=torch.float32, device=self.env.device)
        flags[self.env.rank] = 0.0 if math.isfinite(mine) else 1.0
        torch.distributed.all_reduce(flags)
        return [rank for rank, bad in enumerate(flags.cpu().tolist()) if bad > 0]

    def close(self) -> None:
        """Flush and close the outputs of the session."""
        if self._logger is not None:
            self._logger.close()

    def summary(self, skipped_samples: int) -> RunSummary:
        """Averages over the session's measured steps (the first `logging.summary_skip` left out)."""
        summary = summarize(self.records, self.cfg.logging.summary_skip, self.throughput)
        summary.skipped_samples = skipped_samples
        summary.add_validation(self.validations, time.perf_counter() - self._opened)
        return summary

    def write_report(self, summary: RunSummary, facts: dict[str, Any]) -> None:
        """summary.json (the summary, world size, global batch and `facts`) and, with logging.plots, the
        plots of the whole run so far (earlier sessions included)."""
        report = {
            **summary.as_dict(),
            "world_size": self.env.world_size,
            "global_batch": self.global_batch,
            **facts,
        }
        (self.out_dir / "summary.json").write_text(json.dumps(report, indent=2) + "\n")
        if self.cfg.logging.plots:
            from .plots import write_plots

            metrics = self.out_dir / "metrics.jsonl"
            write_plots(read_history(metrics), summary, self.out_dir, validation=read_validation(metrics))


def _flat_ids(per_microbatch: list[Any]) -> list[int] | None:
    ids: list[int] = []
    for item in per_microbatch:
        if item is None:
            return None
        ids += episode_ids({"episode_index": item}) or []
    return ids


def read_history(path: Path) -> list[StepRecord]:
    """Every step of the run so far (earlier sessions included), last write of a step winning."""
    by_step = {int(row["step"]): StepRecord(**row) for row in _rows(path, kind=None)}
    return [by_step[s] for s in sorted(by_step)]


def read_validation(path: Path) -> list[dict[str, Any]]:
    """Every validation of the run so far (metrics.jsonl's `"kind": "val"` lines), last write of a step
    winning, NaN read back as NaN."""
    by_step = {int(row["step"]): row for row in _rows(path, kind="val")}
    return [by_step[s] for s in sorted(by_step)]


def _rows(path: Path, kind: str | None) -> list[dict[str, Any]]:
    """The lines of metrics.jsonl of one kind (None: step lines, which carry no `kind`), strings -> floats."""
    if not path.is_file():
        return []
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    return [_floats(row) for row in rows if row.get("kind") == kind]


def _floats(row: dict[str, Any]) -> dict[str, Any]:
    # NaN/inf were written as strings (`metrics.records._finite`); `kind` is the one string field
    return {
        k: _floats(v) if isinstance(v, dict) else float(v) if isinstance(v, str) and k != "kind" else v
        for k, v in row.items()
    }
