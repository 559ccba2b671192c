"""The Trainer: the training loop and the training step, in one place. Start reading here.

`Trainer(cfg, parts, env)` builds its components from the run's TrainParts (model, loss, batch source; GR00T's
come from `model.build.build_parts`, tests use tiny stand-ins), each in its concept's subpackage as `component.py`:

    data        DataComponent        a step's microbatches from the BatchSource
    model       ModelComponent       compiled blocks, data-parallel wrapper + AdamW + gradient-sync plan
                                     (`_comm.plan_grad_sync`), lr schedule, the optimizer's side stream, and
                                     vla_graph's GraphedStep running forward/backward (eager or CUDA graphs)
    checkpoint  CheckpointComponent  save and resume the run's state
    metrics     MetricsComponent     per-step records, read to the host per logging window, logs, summary
    validation  ValidationComponent  open-loop action MSE on the held-out episodes vs the mean action,
                                     every `eval.every` steps; leaves the training trajectory untouched

`fit()` claims the run folder and resumes if asked, then `train()` runs the loop: per step the lr, the data,
`train_step()` (forward + backward of every microbatch with the gradient sync, clip, optimizer step), and the
logging, validation, checkpoint and stop decisions."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from ._backends import BackendSwitches
from ._distributed import DistEnv
from ._errors import BatchTooLargeError, ConfigError, TrainingInterrupted
from ._parts import Batch, TrainParts
from ._rng import seed_everything
from ._run_checks import RunChecks
from .checkpoint.component import CheckpointComponent
from .config.io import write_config_json
from .config.optimizations import resolve_optimizations
from .config.sections import TrainConfig
from .data.component import DataComponent
from .metrics.component import MetricsComponent
from .metrics.records import RunSummary
from .metrics.startup import clock as startup_clock
from .metrics.timing import LapClock, StepTimer
from .model.component import ModelComponent
from .run_folder.folder import RunClaim, claim_run
from .validation.component import ValidationComponent


def deterministic_cpu_kernels(device: torch.device) -> Callable[[], None]:
    """On a CPU device, torch's deterministic kernels for the run; returns what restores the previous setting.

    With more than one intra-op thread, torch's CPU `index_put_(accumulate=True)` (the backward of
    `W[slot]`, as in the action head's per-embodiment linears) adds rows with atomic float adds in whatever
    order the threads reach them: two identical runs then differ by an ulp at random steps. Only runs with
    one compute thread (e.g. `data.num_workers=1` on 2 cores) were bit-identical. The deterministic mode
    takes the sorted, fixed-order path instead (as fast or faster here); uninitialized memory is not filled.
    CUDA runs keep their own settings (cuBLAS and some kernels would need more than this switch)."""
    if device.type != "cpu":
        return lambda: None
    before = (
        torch.are_deterministic_algorithms_enabled(),
        torch.is_deterministic_algorithms_warn_only_enabled(),
    )
    fill = torch.utils.deterministic.fill_uninitialized_memory
    torch.use_deterministic_algorithms(True, warn_only=True)  # warn, never fail, where an op has no such path
    torch.utils.deterministic.fill_uninitialized_memory = False

    def restore() -> None:
        torch.use_deterministic_algorithms(before[0], warn_only=before[1])
        torch.utils.deterministic.fill_uninitialized_memory = fill

    return restore


class Trainer:
    """Trains `parts` as `cfg` says, on the process group and device of `env`."""

    def __init__(self, cfg: TrainConfig, parts: TrainParts, env: DistEnv) -> None:
        cfg, _ = resolve_optimizations(cfg, env.device)  # `auto` switches as they run here (run_training did)
        self.cfg, self.parts, self.env = cfg, parts, env
        self.backends = BackendSwitches(cfg)  # TF32 / cuDNN switches: set by fit(), restored when it ends
        self.checks = RunChecks(cfg, env)  # stop requests (SIGTERM/SIGINT), the skipped-sample budget
        seed_everything(cfg.seed + env.rank)
        self.global_batch = cfg.data.batch_size * cfg.optim.grad_accum * env.world_size
        timer = StepTimer(env.device, nested={"comm": "compute"})  # where each step's time goes

        # The components (`<concept>/component.py`).
        self.model = ModelComponent(cfg, parts, env, self.microbatch_step, timer.phase)
        self.data = DataComponent(parts.data, cfg.optim.grad_accum)
        self.checkpoint = CheckpointComponent(cfg, env, parts, self.model, self.data, self.global_batch)
        self.metrics = MetricsComponent(cfg, env, parts, self.global_batch, timer)
        self.validation = ValidationComponent(cfg, env, parts, self.model)

        self.step = 0
        """Optimizer steps done (the checkpoint of a resume sets it)."""
        self.samples_seen = 0
        self.first_step_s: float | None = None
        """Seconds of the first step of the session: compilation and graph capture happen there."""
        self._first_step_end = 0.0  # perf_counter() at the end of the first step
        self.started_at: float | None = None
        """perf_counter() when the run began (set by run_training): start-up is counted from it."""
        self.startup_s: float | None = None
        """Seconds from `started_at` to the end of the first step: process group, model, data, compilation,
        graph capture (a resume's loading included)."""
        self.memory_plan = None
        """memory.budget_gib's plan (`memory.budget.MemoryPlan`, set by run_training): the measured peak
        after step 1 is logged beside its prediction and both go into summary.json."""
        self.step_callback: Callable[[], None] | None = None
        """Called after every step (e.g. a profiler's step())."""
        self.session_parts_s: dict[str, float] = {}
        """Host seconds around the steps (summary.json's `session_parts_s`): the work after the first step
        (of it the compile cache's write), the loop's wall time after the first step, the log flushes' parts
        summed (`flush_issue`, `flush_device_sync`, `flush_records`, `flush_log`) and the end's parts.
        Step times are CUDA events: the GPU idling between steps while the host works shows only here."""
        self.out_dir = Path(cfg.output_dir)

    # ------------------------------------------------------------------------------------------ run
    def fit(self) -> RunSummary:
        """Train to `cfg.steps` (resuming first if asked); returns the summary of this session."""
        run = claim_run(self.cfg, self.env)  # lock, run id, what to resume from (exit 2 on conflicts)
        self.backends.apply()
        restore_determinism = deterministic_cpu_kernels(self.env.device)
        try:
            return self._fit(run)
        finally:
            run.release()
            restore_determinism()
            self.backends.restore()

    def _fit(self, run: RunClaim) -> RunSummary:
        if self.env.is_main:
            write_config_json(self.cfg, self.out_dir / "config.json")
        self.checkpoint.start(run.run_id)
        self.env.barrier()
        if run.resume_from is not None:
            self.step, self.samples_seen = self.checkpoint.resume(run.resume_from)
        start = self.step
        self.metrics.open(start)
        end = LapClock()  # the end's parts (summary.json's session_parts_s), restarted when the loop is over
        try:
            self.checks.stop.install()
            self.train()
            end = LapClock()
            self.model.wait_for_update()
            self.checkpoint.wait()  # a background write still in flight (checkpoint.async_save)
            end.lap("end_write_wait")
        except BaseException:  # a write in flight may finish; the run's own error wins
            self.checkpoint.abandon()
            raise
        finally:
            self.checks.stop.restore()
            self.model.release()  # before the process group can go: graphs hold its collectives
            end.lap("end_model_release")
            self.metrics.close()
            end.lap("end_metrics_close")
            self.data.close()
            end.lap("end_data_close")
            if self.parts.close is not None:
                self.parts.close()
            end.lap("end_parts_close")
            self.checkpoint.release_staging()  # last: unregistering its host memory holds the CUDA driver
            end.lap("end_staging_release")
            self.session_parts_s.update(end.laps)
        if not self.metrics.records:
            raise ConfigError("steps", f"is {self.cfg.steps} and the resumed run is already at step {start}")
        summary = self.metrics.summary(self.checks.skipped)
        self.last_summary = summary
        if self.env.is_main:
            self.metrics.write_report(summary, self.run_facts())
        return summary

    # ------------------------------------------------------------------------------------- the loop
    def train(self) -> None:
        """The training loop, from `self.step` to `cfg.steps`. Nothing in it waits for the device except a
        validation, a checkpoint, the first and the last step: a logging window (every `logging.every` steps)
        is read while the next step runs."""
        try:
            self._loop(self.cfg, self.metrics.timer)
        finally:
            if self.first_step_s is not None:  # the steps after the first, their saves and validations
                self.session_parts_s["loop_after_first_step"] = time.perf_counter() - self._first_step_end

    def _loop(self, cfg: TrainConfig, timer: StepTimer) -> None:
        for step in range(self.step, cfg.steps):
            timer.begin_step()
            lr = self.model.set_lr(step)
            microbatches = self.data.next_step(timer)  # timed as data_wait
            started = time.perf_counter()
            try:
                loss, grad_norm = self.train_step(microbatches)
                if self.first_step_s is None:
                    self._first_step_done(started)
                    self.checkpoint.reserve_staging()  # once compiled and captured: see its docstring
                    self.session_parts_s["after_first_step"] = time.perf_counter() - self._first_step_end
            except torch.cuda.OutOfMemoryError as err:
                raise BatchTooLargeError(
                    step + 1, cfg.data.batch_size, cfg.optim.grad_accum, str(self.env.device), str(err)
                ) from err
            self.step = step + 1
            self.samples_seen += self.global_batch
            self.metrics.add_step(self.step, loss, grad_norm, lr, microbatches)  # still on the device
            if self.metrics.reading:  # the last window's values, read while this step runs
                self._flush_parts(self.metrics.finish)
            if self.step_callback is not None:
                self.step_callback()
            save_now = self._save_due()
            validate = self.validation.due(self.step)
            flush = self.step % cfg.logging.every == 0 or self.step == cfg.steps or save_now or validate
            stop = self.checks.poll(flush, self.data.state_dict(), self.samples_seen)
            if flush or stop:  # a save, a validation, a stop and the end read the window's records now
                wait = save_now or validate or stop or self.step == cfg.steps
                self._flush_parts(self.metrics.flush, self.model.wait_for_update, wait=wait)
            if validate and not stop:  # before the checkpoint: a resume from it keeps this validation
                self.metrics.add_validation(self.validation.run(self.step))
            if save_now or stop:
                saved = self.save()
            if stop:  # SIGTERM / SIGINT: the checkpoint is written, now leave
                raise TrainingInterrupted(self.checks.stop.name, self.step, str(saved))

    def _flush_parts(self, flush: Callable[..., None], *args: Any, **kwargs: Any) -> None:
        """Run a log flush's part, `flush(clock, *args, **kwargs)`, its host seconds by part summed in
        session_parts_s."""
        clock = LapClock()
        flush(clock, *args, **kwargs)
        for name, seconds in clock.laps.items():
            self.session_parts_s[name] = self.session_parts_s.get(name, 0.0) + seconds

    # ------------------------------------------------------------------------------------- the step
    def train_step(self, microbatches: list[Batch]) -> tuple[torch.Tensor, torch.Tensor]:
        """One optimizer step; returns the mean loss and the gradient norm before clipping, on the device.

        1. forward + backward: the GraphedStep zeroes the gradients and runs `microbatch_step` on each
           microbatch (eagerly, or replaying CUDA graphs), every backward but the last only accumulating;
           the gradient sync runs where `plan_grad_sync` (`_comm.py`) put it: launched from the last
           backward, inside its graph, or after the replays (timed as `comm`);
        2. clip to the global norm (`optim.grad_clip`; 0 only measures it) and step AdamW, on the compute
           stream or, with `optimizations.optimizer_overlap`, on a side stream under the next step's frozen
           forward."""
        timer = self.metrics.timer
        with timer.phase("compute"):
            loss = self.model.forward_backward(microbatches)
        with self.model.updating(timer):
            grad_norm = self.model.clip_grad_norm(self.cfg.optim.grad_clip)
            self.model.optimizer.step()
        return loss, grad_norm

    def microbatch_step(self, batch: Batch) -> torch.Tensor:
        """Forward, loss and backward of one microbatch (the GraphedStep calls it, and captures it in graph
        modes, under the gradient sync's no_sync() / launch_in_backward() as its place in the step needs).
        With the optimizer on its side stream, the part that reads no trainable weight runs before waiting
        for the update, and with the update in stages each trainable block waits only for its own stage (also
        where nothing is frozen ahead of them: a run from the prefix cache)."""
        model, parts = self.model, self.parts
        model.note_rows(batch)
        if model.updates is not None:
            # the frozen prefix reads no trainable weight: it runs beside the update
            prefix = () if parts.frozen_prefix is None else (parts.frozen_prefix(batch),)
            model.updates.wait_stage(0)  # staged (staged_update): each block then waits for its own stage
            loss = parts.loss_fn(model.module, batch, *prefix)
            model.updates.wait()  # the whole update and the gradients' zeroing: the backward writes them
        else:
            loss = parts.loss_fn(model.module, batch)  # precision (autocast) is the model's own business
        (loss / self.cfg.optim.grad_accum).backward()
        return loss.detach()

    # ---------------------------------------------------------------------------------- checkpoints
    def save(self) -> Path:
        """Save a checkpoint of the current step (every rank must call this). With checkpoint.async_save the
        files are written in the background, except for the final save and a stop's, which are waited for."""
        self.model.wait_for_update()
        saved = self.checkpoint.save(self.step, self.samples_seen)
        if self.step == self.cfg.steps or self.checks.stop.signum is not None:
            self.checkpoint.wait()
        return saved

    def _save_due(self) -> bool:
        every = self.cfg.checkpoint.every
        final = self.step == self.cfg.steps and self.cfg.checkpoint.save_final
        return final or (every > 0 and self.step % every == 0)

    def _first_step_done(self, started: float) -> None:
        """Time the first step to its end on the device (compilation and graph capture happen there)."""
        self.model.wait_for_update()
        if self.env.device.type == "cuda":
            torch.cuda.synchronize(self.env.device)
        now = self._first_step_end = time.perf_counter()
        self.first_step_s = now - started
        if self.memory_plan is not None:
            self.memory_plan.after_first_step(self.env)
        if self.started_at is not None:
            self.startup_s = now - self.started_at
            startup_clock.first_step(self.first_step_s, self.model.graphed_step.report.capture_seconds)
        if self.model.compile_cache is not None:  # after the clock: its write is no part of start-up
            self.model.compile_cache.after_first_step(write=self.env.is_main)
            self.session_parts_s["compile_cache_write"] = time.perf_counter() - now

    # --------------------------------------------------------------------------------------- report
    def run_facts(self) -> dict[str, Any]:
        """What a report states beside the summary: MFU's peak, start-up, memory, graphs, compiled blocks."""
        cuda = self.env.device.type == "cuda"
        report = self.model.graphed_step.report
        peak = torch.cuda.max_memory_allocated(self.env.device) / 2**30 if cuda else None
        plan = self.memory_plan
        return {
            **({"memory_plan": plan.facts(peak)} if plan is not None else {}),
            "peak_tflops": self.metrics.peak_tflops,
            "first_step_s": self.first_step_s,
            "startup_s": self.startup_s,
            "startup_phases": startup_clock.ordered() if self.startup_s is not None else None,
            "startup_compile_caches": startup_clock.compile_caches if self.startup_s is not None else None,
            "startup_compile_parts": startup_clock.compile_parts if self.startup_s is not None else None,
            "capture_s": report.capture_seconds,
            "graph_backend": report.backend,
            "compiled_blocks": self.model.compiled_blocks,
            "compile_cache": cache.facts() if (cache := self.model.compile_cache) is not None else None,
            "peak_memory_gib": peak,
            "session_parts_s": {k: round(v, 4) for k, v in self.session_parts_s.items()},
            **self.parts.facts,
        }

    # What tests, benchmarks and the profiler read of a trainer (names kept from before the components).
    @property
    def comm(self):
        """The gradient-sync plan (`_comm.SyncPlan`): wrapped module, optimizer, sync, clip."""
        return self.model.plan

    @property
    def updates(self):
        """The optimizer's side stream (vla_overlap.UpdateStream), None without optimizer_overlap."""
        return self.model.updates

    @property
    def graphed_step(self):
        """vla_graph's GraphedStep (its `report`: mode, backend, captures, replays)."""
        return self.model.graphed_step

    @property
    def compiled_blocks(self) -> int:
        """How many repeated blocks were torch.compile'd."""
        return self.model.compiled_blocks

    @property
    def throughput(self):
        """How step times become samples/s, tokens/s and MFU (`metrics.records.Throughput`)."""
        return self.metrics.throughput

    @property
    def checkpointer(self):
        """The run's `Checkpointer` (folder operations, run id)."""
        return self.checkpoint.checkpointer
