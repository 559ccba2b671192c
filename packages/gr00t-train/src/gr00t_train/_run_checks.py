"""Checks the loop runs beside training: a stop request (SIGTERM/SIGINT) that every rank agrees on, the budget
of skipped (undecodable) samples, finite weights before a checkpoint, and which samples of a batch hold
NaN/inf (by episode and frame) when the loss goes non-finite.

Nothing here syncs the host with the device on a normal step: per-sample flags stay on the device until a
non-finite loss asks for them; the agreement between ranks piggybacks on the loop's flush points."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from ._distributed import DistEnv
from ._errors import DataError, NonFiniteWeightsError
from ._peers import peer_noted
from ._signals import StopRequest
from .config.sections import TrainConfig


@dataclass
class SampleTags:
    """Where a microbatch's samples came from, and which of them hold NaN/inf (per floating key, on device)."""

    episodes: Any
    frames: Any
    keys: list[str]
    nonfinite: torch.Tensor | None  # (keys, batch) bool


def tag_samples(batch: dict[str, Any]) -> SampleTags:
    """Tags of one microbatch: its ids as they are, and a per-sample non-finite flag per floating tensor."""
    keys = [
        k
        for k, v in batch.items()
        if isinstance(v, torch.Tensor) and v.is_floating_point() and v.ndim >= 1 and v.numel() > 0
    ]
    flags = None
    if keys:
        size = batch[keys[0]].shape[0]
        keys = [k for k in keys if batch[k].shape[0] == size]
        flags = torch.stack([_nonfinite_rows(batch[k].detach().reshape(size, -1)) for k in keys])
    return SampleTags(batch.get("episode_index"), batch.get("frame_index"), keys, flags)


def _nonfinite_rows(rows: torch.Tensor) -> torch.Tensor:
    """Per row, whether it holds NaN/inf: its largest |value| is finite exactly when every value is (the max
    reduction propagates NaN). One reduction per tensor; `isfinite(...).all()` took four kernels per tensor, about
    0.35 ms of every n1.6-3b step on an H200 (BENCHMARKS.md, levers tried)."""
    return ~torch.isfinite(torch.linalg.vector_norm(rows, float("inf"), dim=1))


def describe_nonfinite(tags: list[SampleTags]) -> tuple[str | None, bool]:
    """('Sample 2 of microbatch 0 (episode 40, frame 117) has NaN/inf in action', checked): the samples that
    hold NaN/inf, or None; `checked` is True when any per-sample flags existed (None with checked=True: every
    input of the batch was finite)."""
    found = []
    checked = False
    for micro, tag in enumerate(tags):
        if tag.nonfinite is None:
            continue
        checked = True
        flags = tag.nonfinite.cpu()
        for sample in torch.nonzero(flags.any(dim=0)).flatten().tolist():
            keys = [k for k, bad in zip(tag.keys, flags[:, sample].tolist()) if bad]
            where = f"episode {_at(tag.episodes, sample)}, frame {_at(tag.frames, sample)}"
            found.append(f"sample {sample} of microbatch {micro} ({where}) has NaN/inf in {', '.join(keys)}")
    if found:
        shown = "; ".join(found[:8]) + (f"; and {len(found) - 8} more" if len(found) > 8 else "")
        return shown[0].upper() + shown[1:], True
    return None, checked


def _at(values: Any, i: int) -> str:
    if values is None:
        return "unknown"
    if isinstance(values, torch.Tensor):
        return str(int(values.reshape(-1)[i]))
    return str(values[i])


def check_weights_finite(model: nn.Module, step: int) -> None:
    """Raise NonFiniteWeightsError (naming the tensors) unless every floating weight is finite."""
    state = model.state_dict()  # ZeRO-1 gathers the parameters first (a state_dict pre-hook)
    names = [k for k, v in state.items() if isinstance(v, torch.Tensor) and v.is_floating_point()]
    if not names:
        return
    finite = torch.stack([torch.isfinite(state[k]).all() for k in names]).cpu().tolist()
    bad = [k for k, ok in zip(names, finite) if not ok]
    if bad:
        shown = ", ".join(bad[:5]) + (f" and {len(bad) - 5} more" if len(bad) > 5 else "")
        raise NonFiniteWeightsError(
            f"the weights hold NaN/inf after step {step} ({shown}): no checkpoint was written from them. "
            "Resume from the last checkpoint with a lower optim.lr (or a smaller optim.grad_clip)"
        )


class RunChecks:
    """Per-run state of the checks: the stop request and the skipped-sample count of every rank."""

    def __init__(self, cfg: TrainConfig, env: DistEnv) -> None:
        self.cfg, self.env = cfg, env
        self.stop = StopRequest(env.world_size, peer_noted)
        self.skipped = 0
        """Samples skipped on every rank together (as of the last flush)."""

    def poll(self, flush: bool, data_state: dict[str, Any], samples_seen: int) -> bool:
        """True when the run must stop now (a signal reached any rank). One rank checks every step; several
        agree at flush points only, in one small all-reduce that also sums their skipped samples."""
        if self.env.world_size > 1 and not flush:
            return False
        mine = [float(self.stop.signum is not None), float(data_state.get("skipped_samples", 0))]
        if self.env.world_size > 1:
            both = torch.tensor(mine, dtype=torch.float64, device=self.env.device)
            torch.distributed.all_reduce(both)
            mine = both.cpu().tolist()
            if self.stop.signum is None and mine[0] > 0:
                self.stop.signum = 15  # another rank was told to stop: stop together (as SIGTERM)
        self.skipped = int(mine[1])
        self._check_budget(samples_seen, int(data_state.get("num_samples", 0)))
        return mine[0] > 0

    def _check_budget(self, seen: int, dataset_size: int) -> None:
        # Measured against at least one epoch: a bad sample among the first few batches must not stop a run
        # whose dataset is 99.9% fine.
        fraction = self.cfg.data.max_bad_fraction
        if self.skipped and self.skipped > fraction * max(seen, dataset_size):
            raise DataError(
                f"{self.skipped} of {seen} samples could not be read (a video that fails to decode, frames of another size, missing frames) and were skipped, more than "
                f"data.max_bad_fraction={fraction:g} allows (of at least one epoch of {dataset_size}); the "
                "warnings above name the files. `vla-io check DATASET` lists every bad file, episode and frame"
            )
