"""Shared fixtures of the gr00t_model tests (tiny shapes: the whole folder runs in well under 3 minutes on 2 cores)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

DATASET = Path(__file__).resolve().parents[1] / "data" / "gr1-picknplace"


@pytest.fixture(autouse=True)
def _seeded() -> None:
    torch.manual_seed(0)


@pytest.fixture
def dataset_meta() -> Path:
    return DATASET / "meta"


@pytest.fixture
def fp32_tiny():
    """Factory of the tiny preset in full fp32 without autocast: results comparable to a plain reference."""
    from gr00t_model import GR00TConfig

    def make(**overrides):
        return GR00TConfig.preset("tiny", frozen_dtype="float32", compute_dtype=None, **overrides)

    return make
