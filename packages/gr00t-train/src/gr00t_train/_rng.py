"""Seeding and saving/restoring every random stream of one process (python, numpy, torch CPU and CUDA)."""

from __future__ import annotations

import random
from typing import Any

import numpy as np
import torch


def seed_everything(seed: int) -> None:
    """Seed python, numpy and torch (CPU and every CUDA device)."""
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


def rng_state(device: torch.device | None = None) -> dict[str, Any]:
    """The random state of this process; with a CUDA device, that device's generator too."""
    state: dict[str, Any] = {
        "python": random.getstate(),
        "numpy": _numpy_state(),
        "torch_cpu": torch.get_rng_state(),
    }
    if device is not None and device.type == "cuda":
        state["torch_cuda"] = torch.cuda.get_rng_state(device)
    return state


def _numpy_state() -> tuple:
    # Tensors and plain numbers only, so checkpoints load with torch.load(weights_only=True).
    name, keys, pos, has_gauss, gauss = np.random.get_state()
    return (name, torch.from_numpy(keys.astype(np.int64)), int(pos), int(has_gauss), float(gauss))


def set_rng_state(state: dict[str, Any], device: torch.device | None = None) -> None:
    """Restore what `rng_state` returned (CUDA state only when both sides have one)."""
    random.setstate(state["python"])
    name, keys, pos, has_gauss, gauss = state["numpy"]
    np.random.set_state((name, keys.numpy().astype(np.uint32), pos, has_gauss, gauss))
    torch.set_rng_state(state["torch_cpu"])
    if device is not None and device.type == "cuda" and "torch_cuda" in state:
        torch.cuda.set_rng_state(state["torch_cuda"], device)
