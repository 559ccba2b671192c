"""The checkpoint component: what a checkpoint of a run holds, and how a run resumes from one.

A checkpoint (written atomically by `Checkpointer`, `_checkpoint.py`) holds the model as `TrainParts.save_model`
writes it, the optimizer state (vla_overlap's ZeRO-1 state is gathered, full size), the trainer state (step,
samples seen, world size, global batch, lr schedule), the resolved config, and per rank the random streams
and the data source's position: a resumed run continues the exact trajectory."""

from __future__ import annotations

import logging
from dataclasses import asdict
from pathlib import Path

import torch

from ..__about__ import __version__
from .._checkpoint import DATASET_FINGERPRINT, TRAIN_CONFIG, Checkpointer
from .._config import TrainConfig
from .._config_io import config_to_dict, read_config_file
from .._dataset_fingerprint import fingerprint, meta_digest, write_fingerprint
from .._distributed import DistEnv
from .._errors import CheckpointError
from .._parts import TrainParts
from .._resume_changes import as_records, config_changes
from .._rng import rng_state, set_rng_state
from .._run_checks import check_weights_finite
from .._schedule import CosineSchedule
from .data import DataComponent
from .model import ModelComponent

log = logging.getLogger(__name__)


class CheckpointComponent:
    """Saves the run's state after a step and restores it (every rank calls both)."""

    def __init__(
        self,
        cfg: TrainConfig,
        env: DistEnv,
        parts: TrainParts,
        model: ModelComponent,
        data: DataComponent,
        global_batch: int,
    ) -> None:
        self.cfg, self.env, self.parts = cfg, env, parts
        self.model, self.data, self.global_batch = model, data, global_batch
        self.checkpointer = Checkpointer(cfg.checkpoint_dir, cfg.checkpoint.keep_last, env.rank, env.barrier)
        self._dataset: dict | None = None
        self.resume_changes: list[dict] = []
        """Settings changed at resumes with --resume-changed (this session's and earlier ones')."""

    def start(self, run_id: str | None) -> None:
        """A run starts: checkpoints are written as `run_id`'s; its interrupted saves are removed; the
        dataset's fingerprint is taken now (what every checkpoint of this session records)."""
        self.checkpointer.run_id = run_id
        self.checkpointer.remove_partial()
        if self.cfg.data.dataset and self.env.is_main:
            self._dataset = fingerprint(self.cfg.data.dataset)

    def save(self, step: int, samples_seen: int) -> Path:
        """Write the checkpoint of `step` (after the update finished); refuses NaN/inf weights."""
        check_weights_finite(self.parts.model, step)
        trainer_state = {
            "step": step,
            "samples_seen": samples_seen,
            "world_size": self.env.world_size,
            "global_batch": self.global_batch,
            # CPU kernels split reductions by thread: a resume is bit-exact at the same count only
            "cpu_threads": torch.get_num_threads() if self.env.device.type == "cpu" else None,
            "schedule": asdict(self.model.schedule),
            "gr00t_train_version": __version__,
        }
        if self._dataset is not None:  # a resume compares the dataset with this (moved or changed in place)
            trainer_state[DATASET_FINGERPRINT] = meta_digest(self._dataset)
        if self.resume_changes:
            trainer_state["resume_changes"] = self.resume_changes
        rank_state = {"rng": rng_state(self.env.device), "data": self.data.state_dict()}

        def write_model(folder: Path) -> None:
            self.parts.save_model(self.parts.model, folder)
            write_fingerprint(self._dataset, folder)

        return self.checkpointer.save(
            step,
            write_model=write_model,
            optimizer_state=self.model.optimizer.state_dict(),
            rank_state=rank_state,
            trainer_state=trainer_state,
            config=config_to_dict(self.cfg),
        )

    def resume(self, path: Path) -> tuple[int, int]:
        """Load model, optimizer, random streams and data position from `path`; returns (step, samples
        seen). claim_run chose `path` (the newest intact checkpoint) and checked world size and batch size."""
        loaded = self.checkpointer.load(path)
        state = loaded.trainer_state
        try:
            self.parts.load_model(self.parts.model, path)
        except Exception as err:  # loaders rarely name the file; say which checkpoint failed
            raise CheckpointError(f"cannot load the model of {path}: {type(err).__name__}: {err}") from err
        if loaded.optimizer_state is not None:
            self.model.optimizer.load_state_dict(loaded.optimizer_state)
        if "schedule" in state:  # a changed `steps` (--resume-changed) continues the recorded schedule
            total = int(state["schedule"]["total_steps"])
            self.model.schedule = CosineSchedule.from_config(self.cfg.optim, total)
        self._record_changes(path, state)
        set_rng_state(loaded.rank_state["rng"], self.env.device)
        self.data.load_state_dict(loaded.rank_state["data"])
        step = int(state["step"])
        samples_seen = int(state.get("samples_seen", step * self.global_batch))
        log.info("resumed from %s at step %d", path, step)
        return step, samples_seen

    def _record_changes(self, path: Path, state: dict) -> None:
        """The settings this resume changes by --resume-changed, after those of earlier resumes: kept in
        every later checkpoint and in summary.json (TrainParts.facts)."""
        saved = read_config_file(path / TRAIN_CONFIG)
        changed = [c for c in config_changes(saved, self.cfg, self.env.device) if c.kind == "trajectory"]
        self.resume_changes = list(state.get("resume_changes", [])) + as_records(changed, int(state["step"]))
        if self.resume_changes:
            self.parts.facts["resume_changes"] = self.resume_changes
