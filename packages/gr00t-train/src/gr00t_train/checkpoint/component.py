"""The checkpoint component: what a checkpoint of a run holds, and how a run resumes from one.

A checkpoint (written atomically by `Checkpointer`, `checkpoint/checkpointer.py`) holds the model's tensors that neither
its base nor the optimizer state hold, as `TrainParts.save_model` writes them (`checkpoint/weights.py`: weights.json
says where the others come from), the optimizer state (vla_overlap's ZeRO-1 state is gathered, full size),
the trainer state (step, samples seen, world size, global batch, lr schedule), the resolved config, and per
rank the random streams and the data source's position: a resumed run continues the exact trajectory (at another world size, the
data order and the schedule continue and the global batch changes: `checkpoint/resize.py`)."""

from __future__ import annotations

import json
import logging
import time
from dataclasses import asdict
from pathlib import Path

import torch
import vla_overlap

from ..__about__ import __version__
from .._distributed import DistEnv
from .._errors import CheckpointError
from .._parts import TrainParts
from .._rng import rng_state, seed_everything, set_rng_state
from .._run_checks import check_weights_finite
from .._schedule import CosineSchedule
from ..config.io import config_to_dict, read_config_file
from ..config.sections import TrainConfig
from ..data.component import DataComponent
from ..data.fingerprint import meta_digest, write_fingerprint
from ..data.mixture import run_fingerprint
from ..metrics.timing import LapClock
from ..model.component import ModelComponent
from .async_save import BackgroundWrite, SaveLog, describe_parts
from .base import describe as describe_base
from .checkpointer import DATASET_FINGERPRINT, TRAIN_CONFIG, Checkpointer, read_trainer_state, step_dir_name
from .host_pool import ALIGN, CHUNK_BYTES, nbytes
from .resize import resize_records, resized_data_state, stream_seed
from .resume_changes import as_records, config_changes
from .staging import Staging, expected_sizes
from .weights import WEIGHTS, ModelView, elsewhere, plan_weights, read_record

RANK_STATE_SLOTS = 16
"""Slots the pool's reservation sets aside for a save's random and data state (small CPU tensors, first)."""

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
        self.saves = SaveLog()
        """This session's saves: the loop's stall, write seconds and bytes, failures (summary.json)."""
        self._inflight: BackgroundWrite | None = None
        self._decode_s = 0.0  # the last write's decoding of 8-bit moments
        budget = cfg.memory.budget_gib
        self.staging = Staging(env.device, budget_bytes=None if budget is None else int(budget * 2**30))
        """Host copies of a save's state, into a pool reused by every save (`checkpoint.staging`)."""
        self.saves.update_wait_s = self.staging.update_wait_s  # one list: the staging appends to it
        self._update_hook = None
        self._reserved = True  # whether reserve_staging has nothing left to do: until a run starts, nothing

    def start(self, run_id: str | None) -> None:
        """A run starts: checkpoints are written as `run_id`'s; its interrupted saves are removed; the
        dataset's fingerprint is taken now (what every checkpoint of this session records)."""
        self.checkpointer.run_id = run_id
        self.checkpointer.abandon.clear()
        self.checkpointer.remove_partial()
        if self.env.is_main:  # the dataset's, or every data.mixture member's
            self._dataset = run_fingerprint(self.cfg)
        self._prepare_staging()
        if self.parts.base is not None and self.env.is_main:
            started = time.perf_counter()
            self._base = describe_base(self.parts.base.path)
            size = sum(entry["bytes"] for entry in self._base["files"].values())
            log.info(
                "checkpoints record the base %s (%d files, %.2f GB, hashed in %.1f s) instead of its frozen weights",
                self.parts.base.path, len(self._base["files"]), size / 1e9, time.perf_counter() - started,
            )  # fmt: skip

    def save(self, step: int, samples_seen: int) -> Path:
        """Save the checkpoint of `step` (every rank, after the update finished; NaN/inf weights are refused);
        returns its final folder. With checkpoint.async_save the state is staged in host memory here and
        written by a background thread (`wait` for it); the loop's stall is what this call takes."""
        clock = LapClock()
        self._settle()  # at most one write in flight: the previous one first
        clock.lap("settle")
        check_weights_finite(self.parts.model, step)  # reads the weights: waits for the step on the device
        clock.lap("finite_check")
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
        staging = self.staging
        staging.begin()
        rank_state = staging.copy({"rng": rng_state(self.env.device), "data": self.data.state_dict()})
        clock.lap("rank_state")
        optimizer_state = self._stage_optimizer()
        clock.lap("optimizer")
        model_tensors, record = {}, None
        if self.env.is_main:  # only rank 0 writes the model
            plan = plan_weights(self.parts.model, self.parts.base, optimizer_state)
            state = self.parts.model.state_dict()
            model_tensors = staging.copy({k: state[k] for k in plan.written})
            record = plan.record(self._base)
        ready = staging.finish()  # the writer waits for the copies; the next update does too
        clock.lap("model_tensors")

        def write_model(folder: Path) -> None:
            self.parts.save_model(ModelView(self.parts.model, model_tensors), folder)
            (folder / WEIGHTS).write_text(json.dumps(record, indent=1) + "\n")
            write_fingerprint(self._dataset, folder)

        config = config_to_dict(self.cfg)
        self.checkpointer.begin(step)  # a barrier: rank 0 made the temporary folder
        clock.lap("folder")

        def job() -> Path:
            # 8-bit moments were staged as stored: decoded here, beside training (vla_overlap.decode_moments)
            started = time.perf_counter()
            vla_overlap.decode_moments(optimizer_state)
            self._decode_s = time.perf_counter() - started  # one write at a time: read once it has ended
            return self.checkpointer.write(
                step, write_model=write_model, optimizer_state=optimizer_state, rank_state=rank_state,
                trainer_state=trainer_state, config=config, world_size=self.env.world_size,
            )  # fmt: skip

        if self.cfg.checkpoint.async_save:
            self._inflight = BackgroundWrite(step, job, ready, speaks=True)
            final = self.checkpointer.root / step_dir_name(step)
            clock.lap("thread")
        else:
            written = time.perf_counter()
            ready()
            ready_s = time.perf_counter() - written
            final = job()
            self.env.barrier()  # every rank returns after rank 0 published, as before
            if self.env.is_main:
                seconds = time.perf_counter() - written
                parts = self._write_parts(ready_s)
                parts["barrier"] = seconds - sum(parts.values())
                self.saves.written(final, seconds, background=False, parts=parts)
            clock.lap("write")
        self.saves.stall_s.append(clock.total())
        self.saves.stall_parts_s.append({**clock.laps, "staging": dict(staging.parts)})
        if staging.memory:
            self.saves.memory_gib.append(staging.memory)  # its peak_after comes with the copies' end
        self.parts.facts.update(self.saves.facts())
        if self.env.is_main and self.cfg.checkpoint.async_save:
            log.info(
                "checkpoint %s: the loop stalled %.3f s (%s), the files are written in the background",
                final.name, self.saves.stall_s[-1], describe_parts(self.saves.stall_parts_s[-1]),
            )  # fmt: skip
        if staging.snapshot_bytes and self.env.is_main:
            log.info("checkpoint %s: %.2f GB of optimizer state copied on the device first (it had room; "
                     "%.2f GB allocated for it now, kept for the next saves)", final.name,
                     staging.snapshot_bytes / 1e9, staging.snapshot.allocated / 1e9)  # fmt: skip
        if staging.pool.grown:
            log.info("checkpoint %s: %.2f GB of host memory allocated for its copies (reused by later saves)",
                     final.name, staging.pool.grown / 1e9)  # fmt: skip
        return final

    def _stage_optimizer(self) -> dict:
        """The optimizer state in host memory (rank 0; the other ranks take part in ZeRO-1's gather only). Its
        tensors are copied beside the next step, which its update waits for (`Staging.before_update`)."""
        optimizer, staging = self.model.optimizer, self.staging
        if isinstance(optimizer, vla_overlap.DistributedAdamW) and self.env.world_size > 1:
            # a collective: every rank gathers each bucket; rank 0 copies it out as soon as it is gathered (8-bit
            # moments gathered as stored, codes and scales: decoded by the writer, as at one rank)
            keep = staging.keep if self.env.is_main else (lambda tensor: None)
            state = optimizer.state_dict(keep=keep, encoded_moments=True)
            return staging.copy(state, fresh_cpu=True) if self.env.is_main else {}
        if isinstance(optimizer, vla_overlap.DistributedAdamW):
            # views of the live masters and moments (8-bit ones as stored: codes and scales, decoded by the writer)
            state = optimizer.state_dict(on_device=True, encoded_moments=True)
        elif self.env.is_main:
            state = optimizer.state_dict()  # torch's AdamW: its live state
        else:
            return {}
        # only the update changes "state"; the rest (param_groups: plain values) is copied in order
        return {key: staging.copy(value, guarded=key == "state") for key, value in state.items()}

    def _prepare_staging(self) -> None:
        """At a run's start: the optimizer's updates wait for a save's copies still reading their state."""
        if self._update_hook is None:
            self._update_hook = self.model.optimizer.register_step_pre_hook(self.staging.before_update)
        self._reserved = False

    def reserve_staging(self) -> None:
        """Reserve the host memory of a save's copies in the background, once per run; the loop calls it when
        its first step has ended. Pinning holds the CUDA driver (with torch's pinned allocator, 22 GB for
        n1.6-3b held it ~11 s: from the run's start it held up the data pipeline's first batch by that much, and
        beside the first step it made graph capture 15 s slower, H200, 2026-12-04; registered chunks hold it
        ~1.2 s in all, 7 ms at a time, H100, 2026-12-06). After the first step, the reservation runs beside
        steps that only replay graphs, resting between chunks so that their launches get the driver
        (`host_pool.REST`), and the first save waits for whatever is left of it."""
        if self._reserved:
            return
        self._reserved = True
        if self.cfg.checkpoint.every > 0 or self.cfg.checkpoint.save_final:
            # sized on every rank: the model's state_dict waits for ZeRO-1's parameter gather, a collective
            sizes = self._expected_sizes()
            if self.env.is_main:
                self.staging.pool.reserve_in_background(sizes)

    def _expected_sizes(self) -> list[int] | int:
        """What a save stages, in order, for the pool's reservation: the random and data state, the optimizer
        state (`staging.expected_sizes`), the model tensors the checkpoint writes (frozen ones of a run from
        random weights: 2.7 GB for n1.6-3b), and one chunk to spare. ZeRO-1 at more ranks gathers whole
        parameters into rank 0's slots: their total, then."""
        optimizer = self.model.optimizer
        zero1 = isinstance(optimizer, vla_overlap.DistributedAdamW)
        # ZeRO-1 holds every trainable weight as a master: the checkpoint writes the rest of the model
        masters = {n: {"master": True} for n, p in self.parts.model.named_parameters() if p.requires_grad}
        plan = plan_weights(self.parts.model, self.parts.base, {"state": masters} if zero1 else None)
        state = self.parts.model.state_dict()
        written = [nbytes(state[k].shape, state[k].dtype) for k in plan.written]
        optimizer_sizes = expected_sizes(optimizer)
        if zero1 and self.env.world_size > 1:
            return sum(optimizer_sizes) * self.env.world_size + sum(written) + (RANK_STATE_SLOTS + 1) * ALIGN
        return [ALIGN] * RANK_STATE_SLOTS + optimizer_sizes + written + [CHUNK_BYTES]

    def release_staging(self) -> None:
        """The run ended: the pool's memory is freed (unregistered in a thread: `HostPool.close`) and the
        updates no longer wait for saves. The trainer calls it last, after the model's graphs are released:
        the unregistering holds the CUDA driver, and the end's CUDA calls would wait for it."""
        if self._update_hook is not None:
            self._update_hook.remove()
            self._update_hook = None
        self.staging.close()  # the last save's update wait is known now
        self.parts.facts.update(self.saves.facts())

    def wait(self) -> None:
        """Wait for the write in flight (the final save, a stop, the end of the run): its failure raises
        CheckpointError on every rank, whatever checkpoint.on_error says (no later save would follow).
        summary.json's `checkpoint_final_wait_s` times the final save's wait."""
        started, waited = time.perf_counter(), self._inflight is not None
        self._settle(final=True)
        if waited:  # a later call (the run's end after a final save) has nothing to time
            self.parts.facts["checkpoint_final_wait_s"] = {"write": round(time.perf_counter() - started, 3)}

    def abandon(self) -> None:
        """The run failed: a write in flight stops waiting for other ranks' parts and is given the time to
        finish what it can, so the checkpoint the loop already staged is not lost (its failure is logged, not
        raised: the run's own error wins). Ctrl-C during the wait leaves without it."""
        self.checkpointer.abandon.set()
        write, self._inflight = self._inflight, None
        if write is not None and not write.join(0):
            log.warning(
                "waiting for the checkpoint of step %d to be written (Ctrl-C: leave without it)", write.step
            )
            write.join(self.checkpointer.rank_timeout_s)

    def _write_parts(self, ready_s: float) -> dict[str, float]:
        """A write's parts: the wait for the staged copies, the 8-bit moments' decoding, Checkpointer.write's."""
        return {"ready": ready_s, "decode_moments": self._decode_s, **self.checkpointer.write_clock.laps}

    def _settle(self, final: bool = False) -> None:
        """Wait for the write in flight and agree on its outcome on every rank (rank 0 knows it: it publishes
        only once every rank's part is written); a failure stops the run as checkpoint.on_error says."""
        write, self._inflight = self._inflight, None
        if write is None:
            return
        write.join()
        if write.error is None and self.env.is_main:
            parts = self._write_parts(write.ready_s or 0.0)
            self.saves.written(write.path, write.seconds, background=True, parts=parts)
        error = write.error
        mine = None if error is None else str(error) if isinstance(error, CheckpointError) else repr(error)
        failure = self.env.broadcast_object(mine)  # a collective: every rank settles at the same save
        if failure is None:
            self.parts.facts.update(self.saves.facts())
            return
        policy = self.cfg.checkpoint.on_error
        self.saves.failed(write.step, failure, policy)
        self.parts.facts.update(self.saves.facts())
        if final or policy == "stop":
            raise CheckpointError(failure) from write.error
        if self.env.is_main:
            log.warning(
                "checkpoint.on_error=continue: training goes on; the next checkpoint is written as planned"
            )

    def resume(self, path: Path) -> tuple[int, int]:
        """Load model, optimizer, random streams and data position from `path`; returns (step, samples
        seen). claim_run chose `path` (the newest intact checkpoint) and checked it fits this run; at another
        world size the ranks' states are shared out again (`checkpoint.resize`)."""
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
