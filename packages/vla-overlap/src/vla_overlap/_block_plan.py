"""The flat step's block plan in array operations (FlatAdamW's planning, at start-up and when rows change).

n1.6-3b's 1.6 B trainable elements make about 1.6 M blocks per rank at one rank; planning them element by
element in Python took seconds per bucket, and a bucket is planned again whenever its rows, tracked rows or
stages change. These functions give the same blocks in the same order, as int64 arrays.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np


def block_table(runs: Sequence[tuple[int, int, int]], length: int, block: int, align_to: int,
                cuts: Sequence[int] = ()) -> tuple[np.ndarray, int]:  # fmt: skip
    """The blocks [n, 3] (start, length, row) over `runs` (start, end, row; ascending, disjoint) and the
    alignment, as FlatAdamW's plan_blocks describes: each run (widened to a multiple of `align_to` where the
    runs, the cuts and `length` all allow it) is cut at every position of `cuts` inside it, and each piece
    between cuts is split into blocks of `block` elements from its start (the last one shorter)."""
    table = np.asarray(runs, dtype=np.int64).reshape(-1, 3)
    cuts = np.unique(np.asarray(cuts, dtype=np.int64))
    starts, ends, rows = table[:, 0], table[:, 1], table[:, 2]
    aligned = length % align_to == 0 and not (starts % align_to).any() and not (cuts % align_to).any()
    align = align_to if aligned else 1
    ends = -(-ends // align) * align
    # the cuts strictly inside a run start pieces of their own
    owner = np.searchsorted(starts, cuts, side="right") - 1
    held = owner >= 0
    held[held] = (cuts[held] > starts[owner[held]]) & (cuts[held] < ends[owner[held]])
    piece_run = np.concatenate([np.arange(len(table)), owner[held]])
    piece_start = np.concatenate([starts, cuts[held]])
    order = np.lexsort((piece_start, piece_run))  # run by run as given, ascending inside each
    piece_run, piece_start = piece_run[order], piece_start[order]
    piece_end = ends[piece_run].copy()
    same = piece_run[1:] == piece_run[:-1]
    piece_end[:-1][same] = piece_start[1:][same]
    counts = np.maximum(-(-(piece_end - piece_start) // block), 0)
    which = np.repeat(np.arange(len(counts)), counts)
    first = np.repeat(np.cumsum(counts) - counts, counts)
    at = piece_start[which] + (np.arange(len(which)) - first) * block
    out = np.stack([at, np.minimum(at + block, piece_end[which]) - at, rows[piece_run[which]]], axis=1)
    return out.astype(np.int64, copy=False), align


def flag_index(block_starts: np.ndarray, spans: Sequence[tuple[int, int, int]]) -> np.ndarray:
    """Per block start, the flag of the span (start, end, flag; ascending, disjoint) that holds it; 0 where
    none does."""
    if not spans:
        return np.zeros(len(block_starts), dtype=np.int64)
    table = np.asarray(spans, dtype=np.int64).reshape(-1, 3)
    s = np.searchsorted(table[:, 1], block_starts, side="right")  # the first span ending after the start
    inside = s < len(table)
    inside[inside] = table[s[inside], 0] <= block_starts[inside]
    return np.where(inside, table[np.minimum(s, len(table) - 1), 2], 0).astype(np.int64)


def as_tuples(table: np.ndarray) -> list[tuple[int, int, int]]:
    """An [n, 3] integer array as a list of n tuples of Python ints."""
    return list(zip(*(table[:, k].tolist() for k in range(3)))) if len(table) else []


class BlockRuns(Sequence):
    """The runs (start, end, row) of the blocks of an [n, 3] table (start, length, row), made into tuples only
    when read: only the torch form of the step reads a stage's runs, the kernel reads its blocks."""

    def __init__(self, blocks: np.ndarray) -> None:
        self.table = np.stack([blocks[:, 0], blocks[:, 0] + blocks[:, 1], blocks[:, 2]], axis=1)

    def __len__(self) -> int:
        return len(self.table)

    def __getitem__(self, index):  # type: ignore[override]
        if isinstance(index, slice):
            return as_tuples(self.table[index])
        return tuple(int(value) for value in self.table[index])

    def __iter__(self):
        return iter(as_tuples(self.table))

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Sequence) and list(self) == list(other)

    def __repr__(self) -> str:
        return f"BlockRuns({len(self)} runs)"
