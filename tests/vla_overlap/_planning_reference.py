"""The flat step's planners as they were written first, element by element in Python: the reference the array
planners (_block_plan, _update_stages.split_by_stage) are checked against."""

from __future__ import annotations

from typing import Any

import torch
from vla_overlap._flat_adamw import ALIGN, BLOCK
from vla_overlap._update_stages import MAX_PIECES_PER_BLOCK


def plan_blocks(runs, length, block=BLOCK, cuts=()):
    aligned = [start for start, _, _ in runs] + list(cuts)
    align = ALIGN if length % ALIGN == 0 and all(at % ALIGN == 0 for at in aligned) else 1
    cuts = sorted(cuts)
    blocks, c = [], 0
    for start, end, row in runs:
        end = -(-end // align) * align
        at = start
        while at < end:
            while c < len(cuts) and cuts[c] <= at:
                c += 1
            stop = min(at + block, end, cuts[c] if c < len(cuts) else end)
            blocks.append((at, stop - at, row))
            at = stop
    return blocks, align


def idle_index(blocks, spans):
    index, s = [], 0
    for start, _, _ in blocks:
        while s < len(spans) and spans[s][1] <= start:
            s += 1
        inside = s < len(spans) and spans[s][0] <= start
        index.append(spans[s][2] if inside else 0)
    return index


def block_stages(blocks: torch.Tensor, pieces: list[tuple[int, int, int]]) -> torch.Tensor:
    """The stage of each block (`blocks` [n, 3]: start, length, row) from `pieces` (start, end, stage) of the
    shard, sorted by start: the earliest stage among the pieces the block overlaps."""
    if len(blocks) == 0:
        return torch.zeros(0, dtype=torch.int64)
    starts = torch.tensor([s for s, _, _ in pieces], dtype=torch.int64)
    ends = torch.tensor([e for _, e, _ in pieces], dtype=torch.int64)
    stage = torch.tensor([k for _, _, k in pieces], dtype=torch.int64)
    begin, end = blocks[:, 0].contiguous(), (blocks[:, 0] + blocks[:, 1]).contiguous()
    first = torch.searchsorted(starts, begin, right=True) - 1  # the piece holding the block's start
    last = torch.searchsorted(starts, end, right=False) - 1
    if int((last - first).max()) >= MAX_PIECES_PER_BLOCK:
        raise ValueError("a block of the flat step overlaps more parameters than the stage plan allows")
    best = stage[first]
    for offset in range(1, int((last - first).max()) + 1):
        at = torch.minimum(first + offset, last)
        overlaps = (starts[at] < end) & (ends[at] > begin)
        best = torch.where(overlaps, torch.minimum(best, stage[at]), best)
    return best


def split_by_stage(flat: dict[str, Any], pieces, count: int) -> list:
    blocks = flat["blocks"].cpu()
    stages = block_stages(blocks, pieces)
    parts: list[dict[str, Any] | None] = []
    for k in range(count):
        chosen = (stages == k).nonzero().flatten()
        if len(chosen) == 0:
            parts.append(None)
            continue
        mine = blocks[chosen]
        idle = flat.get("idle_index")
        parts.append(
            {
                "blocks": mine.to(flat["master"].device),
                "idle_index": None if idle is None else idle[chosen.to(idle.device)],
                "runs": [(s, s + n, r) for s, n, r in mine.tolist()],
            }
        )
    return parts
