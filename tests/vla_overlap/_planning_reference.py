"""The flat step's planners as they were written first, element by element in Python: the reference the array
planners (_block_plan, _update_stages.split_by_stage) are checked against."""

from __future__ import annotations

from typing import Any

from vla_overlap._flat_adamw import ALIGN, BLOCK
from vla_overlap._update_stages import block_stages


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
