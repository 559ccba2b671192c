"""The flat step's array planners against the element-by-element reference (_planning_reference): the same
blocks, alignment, idle-row flags and stage split, on random layouts with ragged and aligned runs."""

from __future__ import annotations

import random

import numpy as np
import pytest
import torch
from _planning_reference import idle_index, plan_blocks, split_by_stage
from vla_overlap._block_plan import as_tuples, block_table, flag_index
from vla_overlap._flat_adamw import ALIGN
from vla_overlap._flat_adamw import plan_blocks as array_plan_blocks
from vla_overlap._update_stages import split_by_stage as array_split_by_stage


def _layout(rng: random.Random, aligned: bool) -> tuple[list, int, list, list]:
    """Runs (some adjacent with other rows, some with gaps, some empty), a length, row cuts and spans."""
    runs, at = [], 0
    for _ in range(rng.randint(0, 30)):
        at += rng.choice([0, 0, 64, 128, 37]) if not aligned else rng.choice([0, 64, 128])
        size = rng.choice([0, 1, 63, 64, 1000, 1024, 1025, 4096, 5000])
        size = -(-size // 64) * 64 if aligned and rng.random() < 0.5 else size
        runs.append((at, at + size, rng.randint(0, 3)))
        at += size
        at = -(-at // 64) * 64 if aligned else at
    length = -(-(at + rng.choice([0, 64])) // 64) * 64 if aligned else at + rng.randint(0, 70)
    cuts, spans = [], []
    for start, end, _ in rng.sample(runs, min(3, len(runs))):
        size = rng.choice([64, 128, 512])
        for s in range(start, end, size):
            cuts += [s, min(s + size, end)]
            spans.append((s, min(s + size, end), len(spans) + 1))
    return runs, length, cuts, sorted(spans)


@pytest.mark.parametrize("aligned", [True, False])
def test_blocks_and_idle_flags_equal_the_reference(aligned: bool) -> None:
    rng = random.Random(7 + aligned)
    for _ in range(300):
        runs, length, cuts, spans = _layout(rng, aligned)
        block = rng.choice([64, 256, 1024])
        expected, expected_align = plan_blocks(runs, length, block=block, cuts=cuts)
        table, align = block_table(runs, length, block, ALIGN, cuts)
        assert (as_tuples(table), align) == (expected, expected_align)
        assert array_plan_blocks(runs, length, block=block, cuts=cuts) == (expected, expected_align)
        assert flag_index(table[:, 0], spans).tolist() == idle_index(expected, spans)
    assert flag_index(np.zeros(0, dtype=np.int64), []).shape == (0,)


def test_stage_split_equals_the_reference() -> None:
    rng = random.Random(3)
    for _ in range(100):
        runs, length, cuts, spans = _layout(rng, True)
        table, _ = block_table(runs, length, 1024, ALIGN, cuts)
        flat = {"blocks": torch.from_numpy(table), "master": torch.zeros(1)}
        if rng.random() < 0.5:
            flat["idle_index"] = torch.from_numpy(flag_index(table[:, 0], spans))
        pieces = [(s, e, rng.randint(0, 4)) for s, e, _ in runs if e > s]
        count = 6
        for got, want in zip(array_split_by_stage(flat, pieces, count), split_by_stage(flat, pieces, count)):
            assert (got is None) == (want is None)
            if got is not None:
                assert got["runs"] == want["runs"] and torch.equal(got["blocks"], want["blocks"])
                assert (got["idle_index"] is None) == (want["idle_index"] is None)
                assert got["idle_index"] is None or torch.equal(got["idle_index"], want["idle_index"])
