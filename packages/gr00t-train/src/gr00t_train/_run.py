"""One training run end to end: process group, parts from the sibling packages, the loop, the report."""

from __future__ import annotations

import logging

from ._config import TrainConfig
from ._distributed import init_distributed, shutdown_distributed
from ._metrics import RunSummary
from ._trainer import Trainer


def run_training(cfg: TrainConfig) -> RunSummary | None:
    """Train as `cfg` says (under torchrun: one process per GPU); returns the summary on rank 0."""
    from ._build import build_parts

    env = init_distributed(cfg.device)
    if not env.is_main:
        logging.getLogger().setLevel(logging.WARNING)  # one voice: rank 0 logs
    try:
        parts = build_parts(cfg, env)
        summary = Trainer(cfg, parts, env).fit()
    finally:
        shutdown_distributed(env)
    return summary if env.is_main else None
