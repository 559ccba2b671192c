"""One training run end to end: process group, parts from the sibling packages, the loop, the report."""

from __future__ import annotations

import json
import logging
import os
import sys
import time
from pathlib import Path

import torch

from ._backends import request_zero_gemm_workspace
from ._distributed import DistEnv, init_distributed, shutdown_distributed
from ._errors import DataError, PeerLostError, TrainingInterrupted
from ._peers import Lost, PeerWatch, looks_like_lost_peer, one_line, store_endpoint
from ._trainer import Trainer
from .checkpoint.checkpointer import Checkpointer
from .config.optimizations import resolve_optimizations
from .config.sections import TrainConfig
from .memory.budget import apply_memory_cap, plan_for_budget
from .metrics.records import RunSummary
from .metrics.startup import clock as startup_clock
from .run_folder.folder import claim_run

log = logging.getLogger(__name__)


class _Progress:
    """How far the run got, for the report of a failure: its id, what it resumed from, the trainer."""

    claimed = False
    run_id: str | None = None
    resumed_from: Path | None = None
    trainer: Trainer | None = None

    def step(self) -> int | None:
        return self.trainer.step if self.trainer is not None else None


def run_training(cfg: TrainConfig) -> RunSummary | None:
    """Train as `cfg` says (under torchrun: one process per GPU); returns the summary on rank 0."""
    from .model.build import build_parts

    started = time.perf_counter()  # start-up (to the end of the first step) is counted from here
    startup_clock.start(started)  # the phases of start-up (_startup): one line and summary.json
    env = init_distributed(cfg.device)  # sets this rank's GPU; no cuBLAS call yet
    cfg, line = resolve_optimizations(cfg, env.device)  # every `auto` switch as it runs on this device
    if env.is_main:
        log.info("%s", line)
    take_out_workspace_env = request_zero_gemm_workspace(cfg)  # before any cuBLAS call (2.11 reads it once)
    apply_memory_cap(env.device)  # $GR00T_TRAIN_MEMORY_CAP_GIB: benchmarks emulating a smaller card
    cfg, memory_plan = plan_for_budget(cfg, env)  # memory.budget_gib: techniques chosen, peak predicted
    if env.device.type == "cpu":
        share_cpu_cores(cfg)
    progress = _Progress()
    peers = PeerWatch.start(env.rank, env.world_size)  # None in a single process
    if peers is not None:
        peers.step = progress.step
        peers.on_hang = lambda lost: _end_stuck_process(cfg, env, progress, lost)
    startup_clock.mark("process_group")
    peer_lost = False
    try:
        # Before anything heavy: the folder lock, other runs' files, the checkpoint to resume from.
        run = claim_run(cfg, env)
        progress.claimed, progress.run_id, progress.resumed_from = True, run.run_id, run.resume_from
        startup_clock.part("run_folder")  # the model phase's first part (metrics.startup.MODEL_PARTS)
        try:
            parts = build_parts(cfg, env)
            startup_clock.mark("data")  # build_parts marks the model's end
            progress.trainer = trainer = Trainer(cfg, parts, env)
            startup_clock.mark("optimizer")  # the wrapper, the optimizer and its planning
            trainer.started_at, trainer.memory_plan = started, memory_plan
            summary = _fit(trainer, cfg, env.rank)  # fit() gets the same claim back
        finally:
            run.release()
    except Exception as err:
        failure = _stalled_worker(err, cfg) or _lost_peer(err, cfg, env, peers, progress)
        peer_lost = isinstance(failure, PeerLostError)
        if peers is not None and not peer_lost and not isinstance(err, TrainingInterrupted):
            peers.note_death(failure or err, progress.step())  # the survivors' report names this reason
        if failure is None:
            raise
        raise failure from err
    finally:
        if peers is not None:
            peers.close()
        shutdown_distributed(env, peer_lost=peer_lost)
        take_out_workspace_env()  # processes started after the run do not inherit it
    return summary if env.is_main else None


def _fit(trainer: Trainer, cfg: TrainConfig, rank: int) -> RunSummary:
    """trainer.fit(), under torch.profiler when `logging.profile_steps` asks (its files beside the metrics)."""
    if cfg.logging.profile_steps == 0:
        return trainer.fit()
    from .metrics.profile import profile_steps

    out = Path(cfg.output_dir)
    summary, kernels = profile_steps(
        trainer,
        skip=cfg.logging.summary_skip,
        active=cfg.logging.profile_steps,
        trace=out / f"trace_rank{rank}.json.gz",
    )
    (out / f"kernels_rank{rank}.json").write_text(json.dumps(kernels, indent=2) + "\n")
    logging.getLogger(__name__).info(
        "profiled %d steps: %s", cfg.logging.profile_steps, out / f"kernels_rank{rank}.json"
    )
    return summary


def _stalled_worker(err: Exception, cfg: TrainConfig) -> DataError | None:
    """The pipeline's timeout, told in gr00t-train's terms (the setting to raise is data.worker_timeout_s)."""
    from vla_io import WorkerTimeoutError

    if not isinstance(err, WorkerTimeoutError):
        return None
    return DataError(
        f"a data worker stalled: {err.detail}, longer than data.worker_timeout_s={cfg.data.worker_timeout_s:g} s. "
        "A hung decoder or a very slow disk are likely causes; raise data.worker_timeout_s if loading is "
        "just slow"
    )


def _lost_peer(
    err: Exception, cfg: TrainConfig, env: DistEnv, peers: PeerWatch | None, progress: _Progress
) -> PeerLostError | None:
    """The survivor's one line when `err` is a collective failing because another rank is gone."""
    if peers is None or not looks_like_lost_peer(err):
        return None
    lost = peers.lost_peers()
    if lost is None:
        return PeerLostError(
            f"lost contact with the other ranks ({one_line(err)}), and the store at {store_endpoint()} does "
            f"not answer either (the node hosting it may be down); this process cannot write a checkpoint "
            f"alone. {_newest_checkpoint(cfg, progress)}"
        )
    if not lost:  # every rank still answers: the failure is this rank's own
        return None
    return _peer_lost_error(cfg, env, progress, lost)


def _peer_lost_error(cfg: TrainConfig, env: DistEnv, progress: _Progress, lost: list[Lost]) -> PeerLostError:
    dead = {x.rank for x in lost}
    first = env.rank - env.local_rank  # this node's ranks, as torchrun numbers them
    node = range(first, first + int(os.environ.get("LOCAL_WORLD_SIZE", env.local_rank + 1)))
    speaks = env.rank == min((r for r in node if r not in dead), default=env.rank)
    them = "it" if len(lost) == 1 else "them"
    return PeerLostError(
        f"{'; '.join(x.describe() for x in lost)}; this process cannot write a checkpoint without {them}. "
        f"{_newest_checkpoint(cfg, progress)}",
        speaks=speaks,
    )


def _newest_checkpoint(cfg: TrainConfig, progress: _Progress) -> str:
    """Where to continue from: this run's newest checkpoint. Every one of them passed the save's last barrier
    whole (or was verified when the run resumed from it); hashing them again here could outlast the
    launcher's grace period (tens of GB for the 3 B model), and --resume verifies anyway."""
    try:
        saved = Checkpointer(cfg.checkpoint_dir, keep_last=1).all(progress.run_id) if progress.claimed else []
    except OSError:
        saved = []
    newest = saved[-1] if saved else progress.resumed_from
    if newest is None:
        return f"No checkpoint of this run was saved yet ({cfg.checkpoint_dir}): start it again"
    return f"The newest intact checkpoint is {newest}: continue with --resume"


def _end_stuck_process(cfg: TrainConfig, env: DistEnv, progress: _Progress, lost: list[Lost]) -> None:
    """The hang backstop (from the peer watch's thread): the main thread is stuck in a collective that
    will not fail (NCCL), so say the line cli would say and end the process."""
    err = _peer_lost_error(cfg, env, progress, lost)
    if err.speaks:
        prefix = f"[rank {env.rank}] " if env.rank else ""
        sys.stderr.write(f"{prefix}gr00t-train train: error: {err}\n")
        sys.stderr.flush()
    os._exit(1)


def share_cpu_cores(cfg: TrainConfig) -> None:
    """CPU training: leave a core to each data worker. More compute threads than free cores makes torch's
    thread pool spin against the workers (measured 30x slower on a busy 2-core machine). The count does not
    depend on the data mode, so sync and async runs compute with the same threads."""
    ranks_here = int(os.environ.get("LOCAL_WORLD_SIZE", 1))
    workers = cfg.data.num_workers
    threads = max(1, (os.cpu_count() or 1) // ranks_here - workers)
    torch.set_num_threads(threads)
    logging.getLogger(__name__).info("CPU training: %d compute thread(s) per rank", threads)
