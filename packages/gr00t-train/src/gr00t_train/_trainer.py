"""The training loop: schedule, data, step, gradient sync, optimizer, metrics, checkpoints, resume."""

from __future__ import annotations

import json
import logging
import math
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch
import vla_overlap

from .__about__ import __version__
from ._backends import BackendSwitches
from ._checkpoint import Checkpointer
from ._comm import plan_grad_sync
from ._config import TrainConfig
from ._config_io import config_to_dict, write_config_json
from ._distributed import DistEnv
from ._errors import (
    BatchTooLargeError,
    CheckpointError,
    ConfigError,
    NonFiniteLossError,
    TrainingInterrupted,
)
from ._metrics import MetricsLogger, RunSummary, StepRecord, Throughput, peak_flops_for, summarize
from ._parts import Batch, TrainParts, episode_ids
from ._rng import rng_state, seed_everything, set_rng_state
from ._run_checks import RunChecks, SampleTags, check_weights_finite, describe_nonfinite, tag_samples
from ._run_folder import claim_run
from ._schedule import CosineSchedule
from ._step import graphed_runner
from ._timing import StepTimer, StepTimes

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


class Trainer:
    """Trains `parts` as `cfg` says, on the process group and device of `env`."""

    def __init__(
        self,
        cfg: TrainConfig,
        parts: TrainParts,
        env: DistEnv,
    ) -> None:
        self.cfg, self.parts, self.env = cfg, parts, env
        self.backends = BackendSwitches(cfg)  # TF32 / cuDNN switches: set by fit(), restored when it ends
        self.checks = RunChecks(cfg, env)
        seed_everything(cfg.seed + env.rank)
        self.compiled_blocks = self._maybe_compile()
        self.comm = plan_grad_sync(parts.model, cfg, env)
        self.timer = StepTimer(env.device, nested={"comm": "compute"})
        opts = cfg.optimizations
        self.updates = vla_overlap.UpdateStream(env.device) if opts.optimizer_overlap else None
        self.run_step, self.graphed_step = graphed_runner(
            cfg, parts, self.comm, self.timer.phase, self.updates
        )
        self.schedule = CosineSchedule.from_config(cfg.optim, cfg.steps)
        self.checkpointer = Checkpointer(cfg.checkpoint_dir, cfg.checkpoint.keep_last, env.rank, env.barrier)
        self.global_batch = cfg.data.batch_size * cfg.optim.grad_accum * env.world_size
        device_name = torch.cuda.get_device_name(env.device) if env.device.type == "cuda" else "cpu"
        peak = peak_flops_for(device_name, cfg.logging.peak_tflops)
        self.peak_tflops = None if peak is None else peak / 1e12
        if peak is not None:
            log.info("MFU counts against %.0f TFLOP/s per %s (%s)", self.peak_tflops, device_name,
                     "logging.peak_tflops" if cfg.logging.peak_tflops else "datasheet dense bf16 peak")  # fmt: skip
        self.throughput = Throughput(  # the global batch's FLOPs against the peak of every rank's device
            self.global_batch,
            parts.tokens_per_sample,
            parts.flops_per_sample,
            None if peak is None else peak * env.world_size,
        )
        self.step = 0
        self.samples_seen = 0
        self.first_step_s: float | None = None
        self.step_callback: Callable[[], None] | None = None
        """Called after every step (e.g. a profiler's step())."""
        self.out_dir = Path(cfg.output_dir)

    def _maybe_compile(self) -> int:
        """torch.compile the model's repeated blocks when optimizations.compile says so; returns how many."""
        mode = self.cfg.optimizations.compile
        if mode == "off" or (mode == "auto" and self.env.device.type != "cuda"):
            return 0
        if self.parts.compile_model is None:
            if mode == "on":
                raise ConfigError("optimizations.compile", "this model offers no blocks to compile")
            return 0
        count = self.parts.compile_model()
        log.info("compiling %d repeated blocks with torch.compile (on the first step)", count)
        return count

    # ------------------------------------------------------------------------------------------- run
    def fit(self) -> RunSummary:
        """Train to `cfg.steps` (resuming first if asked); returns the summary of this session."""
        run = claim_run(self.cfg, self.env)  # lock, run id, what to resume from (exit 2 on conflicts)
        self.backends.apply()
        try:
            return self._fit(run)
        finally:
            run.release()
            self.backends.restore()

    def _fit(self, run) -> RunSummary:
        self.checkpointer.run_id = run.run_id
        if self.env.is_main:
            write_config_json(self.cfg, self.out_dir / "config.json")
        self.checkpointer.remove_partial()
        self.env.barrier()
        self._maybe_resume(run.resume_from)
        start = self.step
        metrics = MetricsLogger(
            self.out_dir,
            total_steps=self.cfg.steps,
            start_step=start,
            enabled=self.env.is_main,
            progress=self.cfg.logging.progress,
            tensorboard=self.cfg.logging.tensorboard,
        )
        try:
            self.checks.stop.install()
            self._loop(metrics)
            self._await_update()
        finally:
            self.checks.stop.restore()
            # Graphs hold the NCCL collectives they captured: free them before the process group can go
            # (destroying a communicator that live graphs still use hangs). The next fit() captures again.
            self.graphed_step.reset()
            if self.env.device.type == "cuda":
                torch.cuda.synchronize(self.env.device)
            metrics.close()
            self.parts.data.close()
            if self.parts.close is not None:
                self.parts.close()
        if not metrics.records:
            raise ConfigError("steps", f"is {self.cfg.steps} and the resumed run is already at step {start}")
        summary = summarize(metrics.records, self.cfg.logging.summary_skip, self.throughput)
        summary.skipped_samples = self.checks.skipped
        self.last_summary = summary
        if self.env.is_main:
            self._write_report(summary)
        return summary

    def _loop(self, metrics: MetricsLogger) -> None:
        cfg = self.cfg
        timer = self.timer
        pending: list[_Pending] = []
        for step in range(self.step, cfg.steps):
            timer.begin_step()
            lr = self.schedule.apply(self.comm.optimizer, step)
            with timer.phase("data_wait"):
                microbatches = [next(self.parts.data) for _ in range(cfg.optim.grad_accum)]
            for name, seconds in self.parts.data.timings().items():
                timer.add(name, seconds)
            started = time.perf_counter() if self.first_step_s is None else None
            try:
                loss, grad_norm = self._step(microbatches, timer)
                if started is not None:  # compilation and graph capture happen in the first step
                    self._await_update()
                    if self.env.device.type == "cuda":
                        torch.cuda.synchronize(self.env.device)
                    self.first_step_s = time.perf_counter() - started
            except torch.cuda.OutOfMemoryError as err:
                raise BatchTooLargeError(
                    step + 1, cfg.data.batch_size, cfg.optim.grad_accum, str(self.env.device), str(err)
                ) from err
            ids = [b.get("episode_index") for b in microbatches]
            tags = [tag_samples(b) for b in microbatches]
            self.step = step + 1
            self.samples_seen += self.global_batch
            pending.append(_Pending(self.step, loss, grad_norm, lr, ids, timer.end_step(), tags))
            if self.step_callback is not None:
                self.step_callback()
            save_now = self._save_due()
            flush = self.step % cfg.logging.every == 0 or self.step == cfg.steps or save_now
            stop = self.checks.poll(flush, self.parts.data.state_dict(), self.samples_seen)
            if flush or stop:
                metrics.log(self._flush(pending))
                pending = []
            if save_now or stop:
                saved = self.save()
            if stop:  # SIGTERM / SIGINT: the checkpoint is written, now leave
                raise TrainingInterrupted(self.checks.stop.name, self.step, str(saved))

    def _step(self, microbatches: list[Batch], timer: StepTimer) -> tuple[torch.Tensor, torch.Tensor]:
        # Gradients are zeroed by the step runner at its start; the sync runs inside it (timed as comm).
        with timer.phase("compute"):
            loss = self.run_step(microbatches)
        if self.updates is None:
            with timer.phase("optimizer"):
                grad_norm = self.comm.clip_grad_norm(self.cfg.optim.grad_clip)
                self.comm.optimizer.step()
            return loss, grad_norm
        # On the side stream: it overlaps the next step's frozen forward (timed there, not in the step).
        with self.updates.side(), timer.phase("optimizer_overlapped"):
            grad_norm = self.comm.clip_grad_norm(self.cfg.optim.grad_clip)
            self.comm.optimizer.step()
        return loss, grad_norm

    def _await_update(self) -> None:
        """Before reading parameters or what the update produced (grad norms) outside the step."""
        if self.updates is not None:
            self.updates.wait()

    def _save_due(self) -> bool:
        every = self.cfg.checkpoint.every
        final = self.step == self.cfg.steps and self.cfg.checkpoint.save_final
        return final or (every > 0 and self.step % every == 0)

    # ------------------------------------------------------------------------------- flush and check
    def _flush(self, pending: list[_Pending]) -> list[StepRecord]:
        """One host sync for a window of steps: global losses, non-finite check, records."""
        self._await_update()
        local = torch.stack([p.loss for p in pending]).float()
        global_loss = self.env.all_reduce_mean(local.clone()).cpu().tolist()
        local = local.cpu().tolist()
        norms = torch.stack([p.grad_norm.float() for p in pending]).cpu().tolist()
        for p, value, mine in zip(pending, global_loss, local):
            if not math.isfinite(value):
                ids = _flat_ids(p.episode_index) if not math.isfinite(mine) else None
                where = describe_nonfinite(p.samples) if not math.isfinite(mine) else None
                raise NonFiniteLossError(
                    p.step, mine if not math.isfinite(mine) else value, ids, self.env.rank, where
                )
        return [
            self.throughput.record(p.step, loss, p.lr, norm, p.times.seconds())
            for p, loss, norm in zip(pending, global_loss, norms)
        ]

    # ---------------------------------------------------------------------------------- checkpoints
    def save(self) -> Path:
        """Write a checkpoint of the current step (every rank must call this)."""
        self._await_update()
        check_weights_finite(self.parts.model, self.step)
        trainer_state = {
            "step": self.step,
            "samples_seen": self.samples_seen,
            "world_size": self.env.world_size,
            "global_batch": self.global_batch,
            "schedule": asdict(self.schedule),
            "gr00t_train_version": __version__,
        }
        rank_state = {"rng": rng_state(self.env.device), "data": self.parts.data.state_dict()}
        return self.checkpointer.save(
            self.step,
            write_model=lambda folder: self.parts.save_model(self.parts.model, folder),
            optimizer_state=self.comm.optimizer.state_dict(),
            rank_state=rank_state,
            trainer_state=trainer_state,
            config=config_to_dict(self.cfg),
        )

    def _maybe_resume(self, path: Path | None) -> None:
        # claim_run chose `path` (the newest intact checkpoint) and checked world size and batch size.
        if path is None:
            return
        loaded = self.checkpointer.load(path)
        state = loaded.trainer_state
        try:
            self.parts.load_model(self.parts.model, path)
        except Exception as err:  # loaders rarely name the file; say which checkpoint failed
            raise CheckpointError(f"cannot load the model of {path}: {type(err).__name__}: {err}") from err
        if loaded.optimizer_state is not None:
            self.comm.optimizer.load_state_dict(loaded.optimizer_state)
        set_rng_state(loaded.rank_state["rng"], self.env.device)
        self.parts.data.load_state_dict(loaded.rank_state["data"])
        self.step = int(state["step"])
        self.samples_seen = int(state.get("samples_seen", self.step * self.global_batch))
        log.info("resumed from %s at step %d", path, self.step)

    # ------------------------------------------------------------------------------------- report
    def run_facts(self) -> dict[str, Any]:
        """What a report states beside the summary: MFU's peak, start-up, memory, graphs, compiled blocks."""
        cuda = self.env.device.type == "cuda"
        report = self.graphed_step.report
        return {
            "peak_tflops": self.peak_tflops,
            "first_step_s": self.first_step_s,
            "capture_s": report.capture_seconds,
            "graph_backend": report.backend,
            "compiled_blocks": self.compiled_blocks,
            "peak_memory_gib": torch.cuda.max_memory_allocated(self.env.device) / 2**30 if cuda else None,
        }

    def _write_report(self, summary: RunSummary) -> None:
        report = {
            **summary.as_dict(),
            "world_size": self.env.world_size,
            "global_batch": self.global_batch,
            **self.run_facts(),
        }
        (self.out_dir / "summary.json").write_text(json.dumps(report, indent=2) + "\n")
        if self.cfg.logging.plots:
            from ._plots import write_plots

            history = _read_history(self.out_dir / "metrics.jsonl")
            write_plots(history, summary, self.out_dir)


def _flat_ids(per_microbatch: list[Any]) -> list[int] | None:
    ids: list[int] = []
    for item in per_microbatch:
        if item is None:
            return None
        ids += episode_ids({"episode_index": item}) or []
    return ids


def _read_history(path: Path) -> list[StepRecord]:
    """Every step of the run so far (earlier sessions included), last write of a step winning."""
    by_step: dict[int, StepRecord] = {}
    if path.is_file():
        for line in path.read_text().splitlines():
            row = {k: (float(v) if isinstance(v, str) else v) for k, v in json.loads(line).items()}
            by_step[int(row["step"])] = StepRecord(**row)
    return [by_step[s] for s in sorted(by_step)]
