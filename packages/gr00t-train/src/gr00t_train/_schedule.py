"""Learning-rate schedule: linear warmup, then cosine decay. Stateless: the lr is a function of the step,
so resuming needs only the step counter (kept in the checkpoint's trainer state)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from .config.sections import OptimConfig


@dataclass(frozen=True)
class CosineSchedule:
    """lr(step) for 0-based optimizer steps: (step + 1) / warmup * peak during warmup, then a half cosine
    from peak to peak * min_lr_ratio over the remaining steps."""

    peak_lr: float
    total_steps: int
    warmup_steps: int
    min_lr_ratio: float = 0.0

    @classmethod
    def from_config(cls, optim: OptimConfig, total_steps: int) -> CosineSchedule:
        """The schedule a training config asks for."""
        warmup = round(optim.warmup_ratio * total_steps)
        return cls(optim.lr, total_steps, warmup, optim.min_lr_ratio)

    def lr(self, step: int) -> float:
        """The learning rate of optimizer step `step` (0-based)."""
        if step < self.warmup_steps:
            return self.peak_lr * (step + 1) / self.warmup_steps
        decay_steps = max(1, self.total_steps - self.warmup_steps)
        progress = min(1.0, (step - self.warmup_steps) / decay_steps)
        floor = self.peak_lr * self.min_lr_ratio
        return floor + (self.peak_lr - floor) * 0.5 * (1.0 + math.cos(math.pi * progress))

    def apply(self, optimizer: Any, step: int) -> float:
        """Set every parameter group's lr for `step`; returns the lr."""
        lr = self.lr(step)
        for group in optimizer.param_groups:
            group["lr"] = lr
        return lr
