"""Which L1 worker loads which samples of a batch, and the batch put back together from its parts.

Without affinity a batch goes whole to one worker, in turn. With affinity (`PipelineConfig.affinity`,
automatic when the dataset has more video files than one worker keeps open) each sample goes to the worker
that owns its affinity key (`LeRobotDataset`: its episode), so every worker decodes only its own files.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from .sampler import BatchTask


def use_affinity(dataset: Any, setting: bool | None) -> bool:
    """Whether to route samples by affinity: the explicit setting, else what the dataset prefers."""
    if getattr(dataset, "affinity", None) is None:
        return False
    if setting is None:
        prefers = getattr(dataset, "prefers_affinity", None)
        return bool(prefers()) if prefers is not None else False
    return setting


class AffinityRouter:
    """Which worker owns each affinity key (LeRobotDataset: the episode), so that every worker decodes only
    its own files and keeps them open. Keys go largest first to the least-loaded worker (by samples), so
    workers get equal shares of the work; a hash would leave some with far more than others.
    """

    def __init__(self, dataset: Any, num_workers: int) -> None:
        keys = np.asarray(dataset.affinity(np.arange(len(dataset))), dtype=np.int64)
        self.keys, counts = np.unique(keys, return_counts=True)
        self.owners = np.zeros(len(self.keys), dtype=np.int64)
        self.load = np.zeros(num_workers, dtype=np.int64)  # samples per worker
        for i in np.lexsort((self.keys, -counts)):  # largest first, ties by key: deterministic
            worker = int(np.argmin(self.load))
            self.owners[i] = worker
            self.load[worker] += counts[i]
        self._affinity = dataset.affinity

    def __call__(self, indices: np.ndarray) -> np.ndarray:
        """The owning worker of each sample."""
        keys = np.asarray(self._affinity(indices), dtype=np.int64)
        return self.owners[np.searchsorted(self.keys, keys)]


def plan_parts(
    task: BatchTask, num_workers: int, router: AffinityRouter | None, turn: int
) -> list[tuple[int, np.ndarray]]:
    """(worker, sample positions) for each part of a batch: by the router's owners, else the whole batch
    to worker `turn`."""
    if router is None or num_workers == 1:
        return [(turn % num_workers, np.arange(len(task.indices)))]
    owners = router(task.indices)
    return [(int(w), np.flatnonzero(owners == w)) for w in np.unique(owners)]


def assemble(parts: list[dict[str, Any]], positions: list[np.ndarray]) -> dict[str, Any]:
    """One batch from parts loaded by different workers, samples back in their original order."""
    if len(parts) == 1:
        return parts[0]
    order = np.argsort(np.concatenate(positions), kind="stable")
    out: dict[str, Any] = {}
    for key in parts[0]:
        values = [p[key] for p in parts]
        if isinstance(values[0], torch.Tensor):
            out[key] = torch.empty((len(order), *values[0].shape[1:]), dtype=values[0].dtype)
            for part, where in zip(values, positions):
                for row, dest in enumerate(where.tolist()):
                    out[key][dest].copy_(part[row])  # row copies: index ops on uint8 are far slower
        else:
            flat = [v for part in values for v in part]
            out[key] = [flat[i] for i in order]
    return out
