"""One training run end to end: process group, parts from the sibling packages, the loop, the report."""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path

import torch

from ._backends import request_zero_gemm_workspace
from ._config import TrainConfig
from ._distributed import init_distributed, shutdown_distributed
from ._errors import DataError
from ._metrics import RunSummary
from ._optimizations import resolve_optimizations
from ._run_folder import claim_run
from ._trainer import Trainer

log = logging.getLogger(__name__)

def run_training(cfg: TrainConfig) -> RunSummary | None:
    """Train as `cfg` says (under torchrun: one process per GPU); returns the summary on rank 0."""
    from ._build import build_parts

    env = init_distributed(cfg.device)  # sets this rank's GPU; no cuBLAS call yet
    cfg, line = resolve_optimizations(cfg, env.device)  # every `auto` switch as it runs on this device
    if env.is_main:
        log.info("%s", line)
    request_zero_gemm_workspace(cfg)  # before anything can call cuBLAS (torch 2.11 reads it once)
    if env.device.type == "cpu":
        share_cpu_cores(cfg)
    try:
        # Before anything heavy: the folder lock, other runs' files, the checkpoint to resume from.
        run = claim_run(cfg, env)
        try:
            parts = build_parts(cfg, env)
            trainer = Trainer(cfg, parts, env)
            summary = _fit(trainer, cfg, env.rank)  # fit() gets the same claim back
        finally:
            run.release()
    except Exception as err:
        stalled = _stalled_worker(err, cfg)
        if stalled is None:
            raise
        raise stalled from err
    finally:
        shutdown_distributed(env)
    return summary if env.is_main else None


def _fit(trainer: Trainer, cfg: TrainConfig, rank: int) -> RunSummary:
    """trainer.fit(), under torch.profiler when `logging.profile_steps` asks (its files beside the metrics)."""
    if cfg.logging.profile_steps == 0:
        return trainer.fit()
    from ._profile import profile_steps

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


def share_cpu_cores(cfg: TrainConfig) -> None:
    """CPU training: leave a core to each data worker. More compute threads than free cores makes torch's
    thread pool spin against the workers (measured 30x slower on a busy 2-core machine). The count does not
    depend on the data mode, so sync and async runs compute with the same threads."""
    ranks_here = int(os.environ.get("LOCAL_WORLD_SIZE", 1))
    workers = cfg.data.num_workers
    threads = max(1, (os.cpu_count() or 1) // ranks_here - workers)
    torch.set_num_threads(threads)
    logging.getLogger(__name__).info("CPU training: %d compute thread(s) per rank", threads)
