"""The model component: the model as the loop trains it.

Built by the Trainer from `TrainParts.model`: its repeated blocks compiled (`optimizations.compile`), wrapped
for data parallelism with its AdamW and a gradient-sync plan (`plan_grad_sync` in `_comm.py`: which object
reduces gradients, and where, for every comm x graph mode), the learning-rate schedule, the optimizer's side
stream (`optimizations.optimizer_overlap`) and vla_graph's GraphedStep, which runs the Trainer's
`microbatch_step` over a step's microbatches eagerly, as one CUDA graph or one graph per microbatch
(`optimizations.graph`), and drives the gradient sync."""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager

import torch
import vla_graph
import vla_overlap

from .._comm import SyncPlan, plan_grad_sync
from .._distributed import DistEnv
from .._errors import ConfigError
from .._parts import Batch, TrainParts
from .._schedule import CosineSchedule
from ..config.sections import TrainConfig
from ..metrics.timing import StepTimer
from .compile_cache import CompileCache

log = logging.getLogger(__name__)
Phase = Callable[[str], AbstractContextManager]
"""The step timer's `phase(name)`: times the enclosed block as `name`."""


class ModelComponent:
    """The model, its optimizer and how one step's forward, backward and gradient sync run."""

    def __init__(
        self,
        cfg: TrainConfig,
        parts: TrainParts,
        env: DistEnv,
        microbatch_step: Callable[[Batch], torch.Tensor],
        phase: Phase,
    ) -> None:
        """`microbatch_step(batch)` runs forward, loss and backward of one microbatch and returns its loss;
        `phase` is the step timer's: the explicit gradient sync is timed with it as `comm`."""
        self.cfg, self.env = cfg, env
        self.compile_cache: CompileCache | None = None
        """optimizations.compile_cache, where the run compiles: loaded before the blocks compile."""
        self.compiled_blocks = _maybe_compile(cfg, parts, env, self)
        self.plan: SyncPlan = plan_grad_sync(parts.model, cfg, env)
        self.rows_touched, self._row_key = _track_rows(cfg, parts, env, self.plan.optimizer)
        """Which rows of TrainParts.row_tables a batch has touched (the optimizer skips the others), or None."""
        self.updates = (
            vla_overlap.UpdateStream(env.device) if cfg.optimizations.optimizer_overlap == "on" else None
        )
        """The optimizer's side stream (optimizations.optimizer_overlap), else None."""
        self._stage_hooks = _stage_update(cfg, parts, self.plan.optimizer, self.updates)
        """Forward pre-hooks making each staged block wait for its stage of the update (staged_update)."""
        self.graphed_step = _graphed_step(cfg, parts, self.plan, microbatch_step, phase, self.updates)
        self.schedule = CosineSchedule.from_config(cfg.optim, cfg.steps)

    @property
    def module(self) -> torch.nn.Module:
        """What forward is called on: the model inside its data-parallel wrapper."""
        return self.plan.module

    @property
    def optimizer(self):
        """AdamW (torch's, or vla_overlap's DistributedAdamW under ZeRO-1)."""
        return self.plan.optimizer

    def note_rows(self, batch: Batch) -> None:
        """Record the table rows this microbatch touches (on the device; captured in graphs)."""
        if self.rows_touched is not None:
            self.rows_touched.index_fill_(0, batch[self._row_key].reshape(-1), True)

    def set_lr(self, step: int) -> float:
        """The schedule's learning rate of 0-based step `step`, set on every parameter group."""
        return self.schedule.apply(self.plan.optimizer, step)

    def forward_backward(self, microbatches: list[Batch]) -> torch.Tensor:
        """Zero the gradients, run every microbatch (forward + backward) and the gradient sync: gradients are
        then the mean over microbatches and ranks. Returns the mean loss, detached, on the device."""
        losses = self.graphed_step(microbatches)
        self._share_rows()
        return torch.stack([loss.float() for loss in losses]).mean()

    def _share_rows(self) -> None:
        """At more than one rank, OR the row record across ranks before the update: each rank steps its shard
        of every row, and a row any rank's batch touched has a gradient after the reduction (track_rows'
        contract). One all-reduce of a byte per row."""
        if self.rows_touched is not None and self.env.world_size > 1:
            torch.distributed.all_reduce(
                self.rows_touched.view(torch.uint8), op=torch.distributed.ReduceOp.MAX
            )

    def clip_grad_norm(self, max_norm: float) -> torch.Tensor:
        """The global gradient norm before clipping; clips to `max_norm` (0: no clipping)."""
        return self.plan.clip_grad_norm(max_norm)

    @contextmanager
    def updating(self, timer: StepTimer) -> Iterator[None]:
        """Where the optimizer step runs: on the compute stream (timed as `optimizer`), or on the side stream,
        overlapping the next step's frozen forward (timed as `optimizer_overlapped`, not part of the step)."""
        if self.updates is None:
            with timer.phase("optimizer"):
                yield
            return
        with self.updates.side(), timer.phase("optimizer_overlapped"):
            yield

    def wait_for_update(self) -> None:
        """Before reading parameters or what the update produced (grad norms) outside the step."""
        if self.updates is not None:
            self.updates.wait()

    def release(self) -> None:
        """Free the captured graphs (they hold the NCCL collectives they captured: a communicator that live
        graphs still use hangs when destroyed). The next call captures again."""
        self.graphed_step.reset()
        for hook in self._stage_hooks:  # the model may outlive this trainer (a benchmark's next row)
            hook.remove()
        if self.env.device.type == "cuda":
            torch.cuda.synchronize(self.env.device)


def _track_rows(cfg: TrainConfig, parts: TrainParts, env: DistEnv, optimizer) -> tuple:
    """(record, batch key) when the optimizer skips untouched table rows (optimizations.skip_untouched_rows):
    one record for all of TrainParts.row_tables (their rows are indexed alike), OR-ed across ranks before each
    update (`_share_rows`)."""
    if parts.row_tables is None or not cfg.optimizations.skip_untouched_rows:
        return None, None
    if not isinstance(optimizer, vla_overlap.DistributedAdamW):
        return None, None
    params, key = parts.row_tables
    rows = {p.shape[0] for p in params if p.requires_grad}
    if len(rows) != 1:
        return None, None
    touched = torch.zeros(rows.pop(), dtype=torch.bool, device=env.device)
    tracked = sum(optimizer.track_rows(p, touched) for p in params if p.requires_grad)
    if not tracked:
        return None, None
    log.info("optimizer: %d table parameters skip the rows no batch has touched", tracked)
    return touched, key


def _stage_update(cfg: TrainConfig, parts: TrainParts, optimizer, updates) -> list:
    """With the optimizer overlapped, the update in stages (optimizations.staged_update): stage 0 the
    parameters outside TrainParts.update_stages' trainable modules, then one stage per module in forward
    order; each module's forward first waits for its stage. Returns the hooks (none where not staged: more
    than one rank, no flat step, or nothing to stage)."""
    if updates is None or not cfg.optimizations.staged_update or parts.update_stages is None:
        return []
    if not isinstance(optimizer, vla_overlap.DistributedAdamW):
        return []
    modules = [m for m in parts.update_stages() if any(p.requires_grad for p in m.parameters())]
    stages = [[p for p in m.parameters() if p.requires_grad] for m in modules]
    if not modules or not optimizer.stage_update(stages, updates):
        return []
    log.info(
        "optimizer: the update in %d stages, each trainable block waiting only for its own", len(stages) + 1
    )
    return [
        m.register_forward_pre_hook(lambda *_, k=k: updates.wait_stage(k)) for k, m in enumerate(modules, 1)
    ]


def _maybe_compile(cfg: TrainConfig, parts: TrainParts, env: DistEnv, component: ModelComponent) -> int:
    """torch.compile the model's repeated blocks when optimizations.compile says so (after loading
    optimizations.compile_cache into component.compile_cache); returns how many."""
    mode = cfg.optimizations.compile
    if mode == "off" or (mode == "auto" and env.device.type != "cuda"):
        return 0
    if parts.compile_model is None:
        if mode == "on":
            raise ConfigError("optimizations.compile", "this model offers no blocks to compile")
        return 0
    if (path := CompileCache.path_for(cfg.optimizations.compile_cache, cfg.output_dir)) is not None:
        component.compile_cache = CompileCache.open(path)
    count = parts.compile_model()
    log.info("compiling %d repeated blocks with torch.compile (on the first step)", count)
    return count


def _graphed_step(
    cfg: TrainConfig,
    parts: TrainParts,
    plan: SyncPlan,
    microbatch_step: Callable[[Batch], torch.Tensor],
    phase: Phase,
    updates: vla_overlap.UpdateStream | None,
) -> vla_graph.GraphedStep:
    """vla_graph's GraphedStep in the mode `optimizations.graph` names, driving the plan's gradient sync (with
    the optimizer on its side stream, gradients are zeroed there, after the update)."""
    sync = plan.grad_sync if updates is None else updates.grad_sync(plan.grad_sync)
    return vla_graph.GraphedStep(
        microbatch_step,
        params=[(name, p) for name, p in parts.model.named_parameters() if p.requires_grad],
        config=vla_graph.GraphConfig(
            mode=cfg.optimizations.graph,
            warmup_iters=cfg.optimizations.graph_warmup,
            sync_in_graph=plan.sync_in_graph,
        ),
        draw=parts.draw,
        grad_sync=TimedGradSync(sync, phase),
    )


class TimedGradSync:
    """A GradSync that times the explicit sync (start + finish) as communication, except while a CUDA graph
    is being captured (no timing events there): with the sync in a graph, its exposed part is in `compute`."""

    def __init__(self, inner, phase: Phase) -> None:
        self._inner, self._phase = inner, phase

    def zero(self) -> None:
        self._inner.zero()

    def no_sync(self) -> AbstractContextManager:
        return self._inner.no_sync()

    def launch_in_backward(self) -> AbstractContextManager:
        return self._inner.launch_in_backward()

    def start(self) -> None:
        if _capturing():
            self._inner.start()
            return
        self._started = self._phase("comm")
        self._started.__enter__()
        self._inner.start()

    def finish(self) -> None:
        try:
            self._inner.finish()
        finally:
            started, self._started = getattr(self, "_started", None), None
            if started is not None:
                started.__exit__(None, None, None)

    def mark_synced(self) -> None:
        self._inner.mark_synced()


def _capturing() -> bool:
    return torch.cuda.is_available() and torch.cuda.is_current_stream_capturing()
