"""Cosine schedule with linear warmup."""

from __future__ import annotations

import math

import pytest
import torch
from gr00t_train import CosineSchedule, OptimConfig


def test_warmup_then_cosine_to_floor() -> None:
    s = CosineSchedule(peak_lr=1.0, total_steps=110, warmup_steps=10, min_lr_ratio=0.1)
    assert s.lr(0) == pytest.approx(0.1) and s.lr(9) == pytest.approx(1.0)
    assert s.lr(10) == pytest.approx(1.0)
    assert s.lr(60) == pytest.approx(0.1 + 0.9 * 0.5)  # half way through the decay
    assert s.lr(110) == pytest.approx(0.1) and s.lr(500) == pytest.approx(0.1)
    decay = [s.lr(i) for i in range(10, 111)]
    assert all(a >= b for a, b in zip(decay, decay[1:]))


def test_from_config_and_apply() -> None:
    s = CosineSchedule.from_config(OptimConfig(lr=3e-4, warmup_ratio=0.05), total_steps=1000)
    assert s.warmup_steps == 50
    assert s.lr(999) == pytest.approx(3e-4 * 0.5 * (1 + math.cos(math.pi * 949 / 950)))
    opt = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=1.0)
    assert s.apply(opt, 49) == pytest.approx(3e-4)
    assert opt.param_groups[0]["lr"] == pytest.approx(3e-4)


def test_no_warmup() -> None:
    s = CosineSchedule(peak_lr=2.0, total_steps=4, warmup_steps=0)
    assert [round(s.lr(i), 6) for i in range(5)] == [
        2.0,
        round(1 + math.cos(math.pi / 4), 6),
        1.0,
        round(1 + math.cos(3 * math.pi / 4), 6),
        0.0,
    ]
