"""The checkpoint component: what a checkpoint of a run holds, and how a run resumes from one.

A checkpoint (written atomically by `Checkpointer`, `_checkpoint.py`) holds the model's tensors that neither
its base nor the optimizer state hold, as `TrainParts.save_model` writes them (`_weights.py`: weights.json
says where the others come from), the optimizer state (vla_overlap's ZeRO-1 state is gathered, full size),
the trainer state (step, samples seen, world size, global batch, lr schedule), the resolved config, and per
rank the random streams and the data source's position: a resumed run continues the exact trajectory (at another world size, the
data order and the schedule continue and the global batch changes: `_resize.py`)."""

from __future__ import annotations

import json
import logging
import time
from dataclasses import asdict
from pathlib import Path

import torch
import vla_overlap

from ..__about__ import __version__
from .._base import describe as describe_base
from .._checkpoint import DATASET_FINGERPRINT, TRAIN_CONFIG, Checkpointer, read_trainer_state
from .._config import TrainConfig
from .._config_io import config_to_dict, read_config_file
from .._dataset_fingerprint import fingerprint, meta_digest, write_fingerprint
from .._distributed import DistEnv
from .._errors import CheckpointError
from .._parts import TrainParts
from .._resize import resize_records, resized_data_state, stream_seed
from .._resume_changes import as_records, config_changes
from .._rng import rng_state, seed_everything, set_rng_state
from .._run_checks import check_weights_finite
from .._schedule import CosineSchedule
from .._weights import WEIGHTS, ModelView, elsewhere, plan_weights, read_record
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
        self._base: dict | None = None
        """The base of the model's frozen weights as checkpoints record it (path and digests), hashed at start."""
        self.resume_changes: list[dict] = []
        """Settings changed at resumes with --resume-changed (this session's and earlier ones')."""

    def start(self, run_id: str | None) -> None:
        """A run starts: checkpoints are written as `run_id`'s; its interrupted saves are removed; the
        dataset's fingerprint is taken now (what every checkpoint of this session records)."""
        self.checkpointer.run_id = run_id
        self.checkpointer.remove_partial()
        if self.cfg.data.dataset and self.env.is_main:
            self._dataset = fingerprint(self.cfg.data.dataset)
        if self.parts.base is not None and self.env.is_main:
            started = time.perf_counter()
            self._base = describe_base(self.parts.base.path)
            size = sum(entry["bytes"] for entry in self._base["files"].values())
            log.info(
                "checkpoints record the base %s (%d files, %.2f GB, hashed in %.1f s) instead of its frozen weights",
                self.parts.base.path, len(self._base["files"]), size / 1e9, time.perf_counter() - started,
            )  # fmt: skip

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
        optimizer_state = self.model.optimizer.state_dict()  # a collective under ZeRO-1: every rank

        def write_model(folder: Path) -> None:
            plan = plan_weights(self.parts.model, self.parts.base, optimizer_state)
            state = self.parts.model.state_dict()
            self.parts.save_model(ModelView(self.parts.model, {k: state[k] for k in plan.written}), folder)
            (folder / WEIGHTS).write_text(json.dumps(plan.record(self._base), indent=1) + "\n")
            write_fingerprint(self._dataset, folder)

        return self.checkpointer.save(
            step,
            write_model=write_model,
            optimizer_state=optimizer_state,
            rank_state=rank_state,
            trainer_state=trainer_state,
            config=config_to_dict(self.cfg),
        )

    def resume(self, path: Path) -> tuple[int, int]:
        """Load model, optimizer, random streams and data position from `path`; returns (step, samples
        seen). claim_run chose `path` (the newest intact checkpoint) and checked it fits this run; at another
        world size the ranks' states are shared out again (`_resize`)."""
        saved_world = int(read_trainer_state(path).get("world_size", 1))
        resized = saved_world != self.env.world_size
        loaded = self.checkpointer.load(path, own_rank_state=not resized)
        state = loaded.trainer_state
        try:  # what the model files hold; the base's tensors were loaded when the model was built
            record = read_record(path)
            self.parts.load_model(ModelView(self.parts.model, elsewhere=elsewhere(record)), path)
        except Exception as err:  # loaders rarely name the file; say which checkpoint failed
            raise CheckpointError(f"cannot load the model of {path}: {type(err).__name__}: {err}") from err
        if loaded.optimizer_state is not None:
            self.model.optimizer.load_state_dict(loaded.optimizer_state)  # ZeRO-1: parameters from masters
        if (
            record is not None
            and record["from_optimizer"]["params"]
            and not isinstance(self.model.optimizer, vla_overlap.DistributedAdamW)
        ):
            raise CheckpointError(
                f"{path} keeps its trainable weights as the optimizer's fp32 masters, which only ZeRO-1's "
                "optimizer sets the parameters from; resume with --set optimizations.comm=zero1_overlap"
            )
        if "schedule" in state:  # a changed `steps` (--resume-changed) continues the recorded schedule
            total = int(state["schedule"]["total_steps"])
            self.model.schedule = CosineSchedule.from_config(self.cfg.optim, total)
        self._record_changes(path, state)
        step = int(state["step"])
        if resized:
            rng, data = self._resized_rank_state(path, saved_world)
        else:
            rng, data = loaded.rank_state["rng"], loaded.rank_state["data"]
        if rng is not None:
            set_rng_state(rng, self.env.device)
        else:  # a rank the checkpoint's run did not have
            seed_everything(stream_seed(self.cfg.seed, self.env.rank, step))
        self.data.load_state_dict(data)
        samples_seen = int(state.get("samples_seen", step * self.global_batch))
        log.info("resumed from %s at step %d", path, step)
        return step, samples_seen

    def _resized_rank_state(self, path: Path, saved_world: int) -> tuple[dict | None, dict]:
        """(random state or None, data position) of this rank at a world size other than the checkpoint's:
        its own streams if the checkpoint's run had this rank, and the ranks' shared data position."""
        ranks = range(saved_world) if self.env.is_main else range(1)  # rank 0 sums the skipped samples
        states = [self.checkpointer.rank_state(path, r) for r in ranks]
        missing = [r for r, s in zip(ranks, states) if s is None]
        if missing:
            raise CheckpointError(
                f"{path}: rank{missing[0]:05d}.pt is missing ({saved_world} ranks wrote it)"
            )
        data = resized_data_state([s["data"] for s in states], self.env.rank, path)
        rank = self.env.rank
        own = states[rank] if rank < len(states) else None
        if own is None and len(states) <= rank < saved_world:
            own = self.checkpointer.rank_state(path, rank)
        return (own["rng"] if own is not None else None), data

    def _record_changes(self, path: Path, state: dict) -> None:
        """The settings this resume changes by --resume-changed (and the world size, when it changes), after
        those of earlier resumes: kept in every later checkpoint and in summary.json (TrainParts.facts)."""
        saved = read_config_file(path / TRAIN_CONFIG)
        changed = [c for c in config_changes(saved, self.cfg, self.env.device) if c.kind == "trajectory"]
        self.resume_changes = (
            list(state.get("resume_changes", []))
            + as_records(changed, int(state["step"]))
            + resize_records(state, self.env.world_size, self.global_batch)
        )
        if self.resume_changes:
            self.parts.facts["resume_changes"] = self.resume_changes
