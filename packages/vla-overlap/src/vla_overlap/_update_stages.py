"""The update in stages, in the order the next forward first reads the parameters (FlatAdamW.set_stages).

With the optimizer on a side stream, the compute stream used to wait for the whole update before its first
trainable read. On an H200 the update (42 GB for n1.6-3b) outlasted the frozen prefix it overlaps by ~6 ms,
all of it waited for. In stages, the first layers' parameters are stepped first, a fence marks each stage's
end (UpdateStream.mark_stage), and each layer waits only for its own stage: the rest of the update runs
beside the first trainable layers.

Stages are given per parameter slot; a kernel block may hold pieces of two parameters (adjacent pieces of one
row are merged into runs), and it goes to the earlier of their stages, so that each stage's fence covers
every element of its parameters. The arithmetic of each block is unchanged: only the order of the blocks
and the number of launches change, so the result is bitwise that of the one-pass step.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from ._block_plan import BlockRuns

MAX_PIECES_PER_BLOCK = 64
"""A bound on how many parameters one block can overlap (blocks are 1024 elements, parameters start at
multiples of 64 in the layout; more only for tiny parameters of a hand-made layout, checked below)."""


def block_stages(blocks: torch.Tensor, pieces: list[tuple[int, int, int]]) -> torch.Tensor:
    """The stage of each block (`blocks` [n, 3]: start, length, row) from `pieces` (start, end, stage) of the
    shard, sorted by start: the earliest stage among the pieces the block overlaps."""
    if len(blocks) == 0:
        return torch.zeros(0, dtype=torch.int64)
    table = np.asarray(pieces, dtype=np.int64).reshape(-1, 3)
    starts, ends, stage = table[:, 0], table[:, 1], table[:, 2]
    begin = blocks[:, 0].numpy()
    end = begin + blocks[:, 1].numpy()
    first = np.searchsorted(starts, begin, side="right") - 1  # the piece holding the block's start
    last = np.searchsorted(starts, end, side="left") - 1
    best = stage[first]
    many = np.flatnonzero(last > first)  # blocks over more than one piece (small parameters side by side)
    if len(many):
        first, last, begin, end = first[many], last[many], begin[many], end[many]
        if int((last - first).max()) >= MAX_PIECES_PER_BLOCK:
            raise ValueError("a block of the flat step overlaps more parameters than the stage plan allows")
        low = best[many]
        for offset in range(1, int((last - first).max()) + 1):
            at = np.minimum(first + offset, last)
            overlaps = (starts[at] < end) & (ends[at] > begin)
            low = np.where(overlaps, np.minimum(low, stage[at]), low)
        best[many] = low
    return torch.from_numpy(best)


def split_by_stage(flat: dict[str, Any], pieces: list[tuple[int, int, int]], count: int) -> list:
    """Per stage, what narrows bucket `flat` to that stage's blocks (None where it has none): its `blocks`,
    `idle_index` and `runs` (one per block), to lay over the bucket's entries (the buffers stay the bucket's)."""
    blocks = flat["blocks"].cpu()
    stages = block_stages(blocks, pieces).numpy()
    # the blocks grouped by stage, each group in the bucket's order: one stable sort (a radix sort on
    # 16-bit keys), not a scan of every block per stage
    order = np.argsort(stages.astype(np.int16 if count < 2**15 else np.int64), kind="stable")
    sizes = np.bincount(stages, minlength=count)
    table = blocks.numpy()[order]
    idle = flat.get("idle_index")
    parts: list[dict[str, Any] | None] = []
    at = 0
    for k in range(count):
        size = int(sizes[k])
        if size == 0:
            parts.append(None)
            continue
        chosen = torch.from_numpy(order[at : at + size])
        parts.append(
            {
                "blocks": torch.from_numpy(table[at : at + size]).to(flat["master"].device),
                "idle_index": None if idle is None else idle[chosen.to(idle.device)],
                "runs": BlockRuns(table[at : at + size]),
            }
        )
        at += size
    return parts
