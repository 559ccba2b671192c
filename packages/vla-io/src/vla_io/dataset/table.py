"""The tabular part of a dataset (parquet rows) loaded once into numpy arrays, one per feature."""

from __future__ import annotations

import logging
from collections.abc import Sequence

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from .._errors import DatasetFormatError
from .meta import DatasetMeta, Episode

log = logging.getLogger(__name__)


def column_to_numpy(column: pa.ChunkedArray | pa.Array, where: str) -> np.ndarray:
    """A parquet column as numpy: lists become (N, D) arrays; floats become float32 (as LeRobot returns)."""
    if isinstance(column, pa.ChunkedArray):
        column = column.combine_chunks()
    kind = column.type
    if pa.types.is_list(kind) or pa.types.is_large_list(kind) or pa.types.is_fixed_size_list(kind):
        if column.null_count:
            raise DatasetFormatError(f"{where}: {column.null_count} null rows")
        lengths = column.value_lengths().to_numpy(zero_copy_only=False) if len(column) else np.zeros(0, int)
        if len(lengths) and (lengths != lengths[0]).any():
            raise DatasetFormatError(
                f"{where}: vector rows of different lengths {sorted(set(lengths.tolist()))}"
            )
        flat = column.flatten().to_numpy(zero_copy_only=False)
        width = int(lengths[0]) if len(lengths) else getattr(kind, "list_size", 0)  # no rows: the type says
        values = flat.reshape(len(column), width)
    elif pa.types.is_string(kind) or pa.types.is_large_string(kind):
        values = np.asarray(column.to_pylist(), dtype=object)
    elif pa.types.is_struct(kind) or pa.types.is_binary(kind):
        raise DatasetFormatError(f"{where}: unsupported column type {kind} (images stored in parquet)")
    else:
        values = column.to_numpy(zero_copy_only=False)
    if values.dtype.kind == "f":
        return values.astype(np.float32, copy=False)
    if values.dtype.kind in "iu":
        return values.astype(np.int64, copy=False)
    return values


def index_ranges(values: Sequence[int]) -> str:
    """Sorted integers as ranges: [3, 4, 5, 9] -> '3-5, 9'."""
    values = [int(v) for v in values]
    out, start = [], None
    for i, v in enumerate(values):
        if start is None:
            start = v
        if i + 1 == len(values) or values[i + 1] != v + 1:
            out.append(str(start) if start == v else f"{start}-{v}")
            start = None
    return ", ".join(out)


def unknown_task_rows(meta: DatasetMeta, task_index: np.ndarray) -> np.ndarray:
    """Positions of the rows whose `task_index` names no task of the dataset's tasks file."""
    known = np.fromiter(meta.tasks, dtype=np.int64, count=len(meta.tasks))
    return np.flatnonzero(~np.isin(np.asarray(task_index), known))


def unknown_task_reason(meta: DatasetMeta, values: Sequence[int]) -> str:
    """'task_index 99 is not in meta/tasks.jsonl (task indices 0-3)': why rows with these values are bad."""
    tasks_file = "meta/tasks.parquet" if meta.is_v3 else "meta/tasks.jsonl"
    shown = sorted({int(v) for v in values})
    known = f"task indices {index_ranges(sorted(meta.tasks))}" if meta.tasks else "no tasks"
    return f"task_index {index_ranges(shown)} is not in {tasks_file} ({known})"


class FrameTable:
    """Every parquet row of the selected episodes, concatenated in episode order.

    `columns[key][row]` is one frame's value; `starts[e]`/`ends[e]` bound episode e's rows (position in
    `episodes`), and `row_episode[row]` gives that position back.
    """

    def __init__(
        self, meta: DatasetMeta, episodes: Sequence[Episode], strict: bool = True, progress: bool = True
    ) -> None:
        from tqdm.auto import tqdm

        self.episodes = list(episodes)
        skip = set(meta.video_keys) | set(meta.image_keys)
        by_file: dict[str, list[int]] = {}
        for pos, ep in enumerate(self.episodes):
            by_file.setdefault(str(ep.data_path), []).append(pos)
        parts: dict[int, dict[str, np.ndarray]] = {}
        files = tqdm(by_file.items(), desc="reading parquet", disable=not progress or len(by_file) < 50)
        for path, positions in files:
            parts.update(
                self._read_file(path, [self.episodes[p] for p in positions], positions, skip, strict)
            )
        keys = list(parts[0]) if parts else []
        self._check_same_columns(meta, parts)
        self.columns = {k: np.concatenate([parts[p][k] for p in range(len(self.episodes))]) for k in keys}
        lengths = np.array([e.length for e in self.episodes], dtype=np.int64)
        self.ends = np.cumsum(lengths)
        self.starts = self.ends - lengths
        self.row_episode = np.repeat(np.arange(len(self.episodes)), lengths)
        if "frame_index" not in self.columns:  # some datasets lack it; it is the row's place in its episode
            self.columns["frame_index"] = np.arange(len(self.row_episode)) - self.starts[self.row_episode]

    def __len__(self) -> int:
        return len(self.row_episode)

    def _check_same_columns(self, meta: DatasetMeta, parts: dict[int, dict[str, np.ndarray]]) -> None:
        """Every data file must hold the same columns: DatasetFormatError naming the file, episode and
        column, blaming a file that lacks a declared feature before one that has an undeclared extra."""
        union = {key for part in parts.values() for key in part}
        declared = [k for k, f in meta.features.items() if k in union]
        for pos, part in parts.items():
            lacking = [k for k in declared if k not in part]
            if lacking:
                raise DatasetFormatError(
                    f"{self.episodes[pos].data_path}: episode {self.episodes[pos].index}: no column "
                    f"{', '.join(map(repr, lacking))}, which meta/info.json declares and other data files "
                    "have. `vla-io check` lists every such file"
                )
        for pos, part in parts.items():
            extra = [k for k in part if k not in declared and any(k not in p for p in parts.values())]
            if extra:
                raise DatasetFormatError(
                    f"{self.episodes[pos].data_path}: episode {self.episodes[pos].index}: column "
                    f"{', '.join(map(repr, extra))}, which other data files lack and meta/info.json does not "
                    "declare"
                )

    @staticmethod
    def _read_file(
        path: str, episodes: list[Episode], positions: list[int], skip: set[str], strict: bool
    ) -> dict[int, dict[str, np.ndarray]]:
        try:
            table = pq.read_table(path)
        except FileNotFoundError:
            raise DatasetFormatError(f"{path}: data file of episode {episodes[0].index} not found") from None
        except Exception as err:
            raise DatasetFormatError(f"{path}: cannot read parquet ({err})") from err
        names = [n for n in table.column_names if n not in skip]
        has_column = "episode_index" in table.column_names
        if has_column:
            episode_of_row = column_to_numpy(table["episode_index"], f"{path}: episode_index")
        elif len(episodes) == 1:
            episode_of_row = np.full(table.num_rows, episodes[0].index)
        else:
            raise DatasetFormatError(
                f"{path}: no 'episode_index' column in a file shared by several episodes"
            )
        out = {}
        for pos, ep in zip(positions, episodes):
            rows = np.flatnonzero(episode_of_row == ep.index)
            if len(rows) != ep.length:
                held = index_ranges(np.unique(episode_of_row).tolist())
                column = f" (the file's 'episode_index' values: {held})" if has_column else ""
                raise DatasetFormatError(
                    f"{path}: episode {ep.index} has {len(rows)} rows but its metadata says length {ep.length}"
                    + column
                )
            part = table.take(pa.array(rows)) if len(rows) != table.num_rows else table
            out[pos] = {n: column_to_numpy(part[n], f"{path}: episode {ep.index}, key {n!r}") for n in names}
            frame_index = out[pos].get("frame_index")
            if strict and frame_index is not None and not np.array_equal(frame_index, np.arange(ep.length)):
                raise DatasetFormatError(
                    f"{path}: episode {ep.index}: 'frame_index' is not 0..{ep.length - 1}"
                )
        return out
