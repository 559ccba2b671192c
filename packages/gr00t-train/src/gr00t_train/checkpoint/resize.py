"""A resume at another world size (elastic resume): what carries over, what is derived, what is refused.

A checkpoint written by N processes resumes on M:

- the optimizer state is world-size independent already (torch's AdamW state is per parameter; vla_overlap's
  ZeRO-1 state is gathered per parameter when saved and cut into this world's shards when loaded);
- the step count, the lr schedule (a function of the step) and `samples_seen` continue;
- the data order continues in the epoch's global order: vla-io's Pipeline state records how many places of
  that order every rank together had taken, and each of the M ranks takes its share of the rest of the epoch
  (every rank starts from rank 0's position; the skipped-sample counts of the N ranks go to rank 0, so their
  sum, which the budget checks, carries over);
- random streams: a rank that existed keeps its own; a new rank's are seeded from (seed, rank, step);
- the global batch changes with M (unless data.batch_size changes with it, by --resume-changed), so the
  trajectory differs from the original run's: a warning says so and the run records the change
  (`resume_changes`, like a setting allowed by --resume-changed).

The LeRobot-style baseline loader (optimizations.data=dataloader) keeps a per-rank position only: a resume of
it at another world size is refused before the model is built.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import numpy as np

from .._errors import CheckpointError, ConfigError

log = logging.getLogger(__name__)


def stream_seed(seed: int, rank: int, step: int) -> int:
    """The seed of a rank's random streams when the checkpoint holds none for it (a rank added by a resume
    at a larger world size): a function of the run's seed, the rank and the step only."""
    return int(np.random.SeedSequence([seed, rank, step, 0xE1A5]).generate_state(1, np.uint32)[0])


def check_resize(
    path: Path, state: dict[str, Any], saved_config: dict[str, Any], data_mode: str, global_batch: int,
    world_size: int, fresh: str,
) -> None:  # fmt: skip
    """Refuse (ConfigError, before the model is built) a resume at another world size that cannot continue;
    otherwise warn once, naming the global batch before and after."""
    saved_world = int(state.get("world_size", 1))
    saved_mode = (saved_config.get("optimizations") or {}).get("data", data_mode)
    if "dataloader" in (saved_mode, data_mode):
        raise ConfigError(
            "optimizations.data",
            f"{path} was written by {saved_world} process(es); this run has {world_size}, and the LeRobot-style "
            "baseline loader (optimizations.data=dataloader) keeps a per-rank position that cannot be shared "
            f"out again. Resume on {saved_world} process(es), or with optimizations.data=async on both. {fresh}",
        )
    before = state.get("global_batch")
    step = int(state["step"])
    if before is None or int(before) != global_batch:
        batch = (
            f"the global batch goes from {before if before is not None else '?'} to {global_batch} samples per "
            "step, so the run no longer follows the original trajectory (recorded in the run's resume_changes)"
        )
    else:
        batch = (
            f"the global batch stays {global_batch} samples per step, but the ranks' random draws are not the "
            "original run's, so it follows the original trajectory only approximately"
        )
    added = (
        f"; ranks {saved_world}..{world_size - 1} have no random state in it: their streams are seeded "
        f"from (seed, rank, step {step})"
        if world_size > saved_world
        else ""
    )
    log.warning(
        "resuming %s, written by %d process(es), on %d: %s. The step count, the lr schedule and samples seen "
        "continue; the data order continues where the %d rank(s) stopped in the epoch's global order, each "
        "rank taking its share of the rest%s",
        path, saved_world, world_size, batch, saved_world, added,
    )  # fmt: skip


def resize_records(state: dict[str, Any], world_size: int, global_batch: int) -> list[dict[str, Any]]:
    """What a resume at another world size changed, as `resume_changes` records (empty at the same size)."""
    saved_world = int(state.get("world_size", 1))
    if saved_world == world_size:
        return []
    step = int(state["step"])
    records = [{"step": step, "key": "world_size", "from": saved_world, "to": world_size}]
    before = state.get("global_batch")
    if before is not None and int(before) != global_batch:
        records.append({"step": step, "key": "global_batch", "from": int(before), "to": global_batch})
    return records


def resized_data_state(states: list[dict[str, Any]], rank: int, path: Path) -> dict[str, Any]:
    """The data position rank `rank` of the new world starts from: rank 0's of the checkpoint (the data
    source converts it to this world size), with the saved ranks' skipped samples summed on rank 0."""
    first = states[0]
    position = {k: v for k, v in first.items() if k != "skipped_samples"}
    for index, other in enumerate(states[1:], 1):
        if _position(other) != _position(first):
            raise CheckpointError(
                f"{path}: rank{index:05d}.pt and rank00000.pt disagree on the data position "
                f"({_position(other)} vs {_position(first)}); the checkpoint is damaged, resume from another"
            )
    if "skipped_samples" in first:
        skipped = sum(int(s.get("skipped_samples", 0)) for s in states)
        position["skipped_samples"] = skipped if rank == 0 else 0
    return position


def _position(state: dict[str, Any]) -> dict[str, Any]:
    """The part of a data state that every rank shares (the place in the order, not the rank's own count)."""
    keys = ("epoch", "batch", "epoch_start", "consumed", "position")
    return {k: state[k] for k in keys if k in state}
