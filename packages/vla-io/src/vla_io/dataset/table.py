"""The tabular part of a dataset (parquet rows) loaded once into numpy arrays, one per feature."""

from __future__ import annotations

import logging
from collections.abc import Sequence

import numpy as np
import pyarrow as pa

from .._errors import DatasetFormatError
from .meta import DatasetMeta, Episode
from .parquet_file import read_parquet

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


FileRows = dict[str, np.ndarray] | list[dict[str, np.ndarray]]
"""The selected episodes' rows of one data file: columns holding the episodes' rows one after another
(the fast path), or one dict of columns per episode (the plain path, taken only for a file it must judge)."""


def read_file_rows(path: str, episodes: Sequence[Episode], skip: set[str], strict: bool) -> FileRows:
    """The rows of `episodes` (in that order) of data file `path`, checked: row counts against the episodes
    index and, with `strict`, `frame_index` 0..length-1 in each episode.

    The file is read once and each column converted once; episodes' rows are found with one sort of
    `episode_index`. Anything the fast path cannot take as it is (a failed check, null values, vectors of
    different lengths) sends the file through the plain per-episode reader, whose errors name the first
    bad episode and key as they always have.
    """
    try:
        table = read_parquet(path)
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
        raise DatasetFormatError(f"{path}: no 'episode_index' column in a file shared by several episodes")
    columns = _rows_at_once(table, names, episode_of_row, episodes, strict)
    if columns is None:
        return _rows_one_by_one(path, table, names, episode_of_row, has_column, episodes, strict)
    return columns


def _rows_at_once(
    table: pa.Table, names: list[str], episode_of_row: np.ndarray, episodes: Sequence[Episode], strict: bool
) -> dict[str, np.ndarray] | None:
    """The fast path of `read_file_rows`; None where a check fails or a column needs the plain path."""
    if episode_of_row.dtype.kind != "i":  # nulls made it float: the plain path says which rows are missing
        return None
    wanted = np.array([ep.index for ep in episodes], dtype=np.int64)
    lengths = np.array([ep.length for ep in episodes], dtype=np.int64)
    starts = np.cumsum(lengths) - lengths
    total = int(lengths.sum())
    order = None  # rows sorted by episode, stable: within an episode, file order
    if len(episode_of_row) > 1 and (np.diff(episode_of_row) < 0).any():
        order = np.argsort(episode_of_row, kind="stable")
    by_episode = episode_of_row if order is None else episode_of_row[order]
    first = np.searchsorted(by_episode, wanted, side="left")
    count = np.searchsorted(by_episode, wanted, side="right") - first
    if (count != lengths).any():
        return None
    rows = np.repeat(first - starts, lengths) + np.arange(total)
    rows = rows if order is None else order[rows]
    whole = total == table.num_rows and (rows == np.arange(total)).all()
    part = table if whole else table.take(pa.array(rows))
    out = {}
    for name in names:
        column = part[name]
        if column.null_count:
            return None
        try:
            out[name] = column_to_numpy(column, name)
        except DatasetFormatError:
            return None
    frame_index = out.get("frame_index")
    if strict and frame_index is not None:
        expected = np.arange(total) - np.repeat(starts, lengths)
        if frame_index.shape != expected.shape or (frame_index != expected).any():
            return None
    return out


def _rows_one_by_one(
    path: str,
    table: pa.Table,
    names: list[str],
    episode_of_row: np.ndarray,
    has_column: bool,
    episodes: Sequence[Episode],
    strict: bool,
) -> list[dict[str, np.ndarray]]:
    """The plain path of `read_file_rows`: each episode's rows taken and checked on their own."""
    out = []
    for ep in episodes:
        rows = np.flatnonzero(episode_of_row == ep.index)
        if len(rows) != ep.length:
            held = index_ranges(np.unique(episode_of_row).tolist())
            column = f" (the file's 'episode_index' values: {held})" if has_column else ""
            raise DatasetFormatError(
                f"{path}: episode {ep.index} has {len(rows)} rows but its metadata says length {ep.length}"
                + column
            )
        part = table.take(pa.array(rows)) if len(rows) != table.num_rows else table
        out.append({n: column_to_numpy(part[n], f"{path}: episode {ep.index}, key {n!r}") for n in names})
        frame_index = out[-1].get("frame_index")
        if strict and frame_index is not None and not np.array_equal(frame_index, np.arange(ep.length)):
            raise DatasetFormatError(f"{path}: episode {ep.index}: 'frame_index' is not 0..{ep.length - 1}")
    return out


def _episode_columns(rows: FileRows, lengths: Sequence[int]) -> list[dict[str, np.ndarray]]:
    """`rows` as one dict per episode (views into the columns of the fast path)."""
    if isinstance(rows, list):
        return rows
    ends = np.cumsum(np.asarray(lengths, dtype=np.int64)).tolist()
    return [{n: v[end - length : end] for n, v in rows.items()} for end, length in zip(ends, lengths)]


def _joined_columns(rows: FileRows) -> dict[str, np.ndarray]:
    """`rows` as columns holding the episodes one after another."""
    if isinstance(rows, dict):
        return rows
    return {k: np.concatenate([part[k] for part in rows]) for k in rows[0]} if rows else {}


def _column_names(rows: FileRows) -> list[str]:
    return list(rows) if isinstance(rows, dict) else list(rows[0]) if rows else []


class FrameTable:
    """Every parquet row of the selected episodes, concatenated in episode order.

    `columns[key][row]` is one frame's value; `starts[e]`/`ends[e]` bound episode e's rows (position in
    `episodes`), and `row_episode[row]` gives that position back. Each data file is read once and each of
    its columns converted to numpy once; episodes' rows are found and gathered with index arrays.
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
        files: list[tuple[list[int], FileRows]] = []
        bar = tqdm(by_file.items(), desc="reading parquet", disable=not progress or len(by_file) < 50)
        for path, positions in bar:
            files.append(
                (positions, read_file_rows(path, [self.episodes[p] for p in positions], skip, strict))
            )
        self._check_same_columns(meta, files)
        lengths = np.array([e.length for e in self.episodes], dtype=np.int64)
        self.ends = np.cumsum(lengths)
        self.starts = self.ends - lengths
        self.columns = self._in_episode_order(files, lengths)
        self.row_episode = np.repeat(np.arange(len(self.episodes)), lengths)
        if "frame_index" not in self.columns:  # some datasets lack it; it is the row's place in its episode
            self.columns["frame_index"] = np.arange(len(self.row_episode)) - self.starts[self.row_episode]

    def __len__(self) -> int:
        return len(self.row_episode)

    def _in_episode_order(
        self, files: list[tuple[list[int], FileRows]], lengths: np.ndarray
    ) -> dict[str, np.ndarray]:
        """The files' columns joined, their rows gathered into episode order (one take per column, none
        when the files already hold the episodes in order, as they do in LeRobot's layouts)."""
        if not files:
            return {}
        file_order = np.concatenate([np.asarray(positions, dtype=np.int64) for positions, _ in files])
        # where each episode's rows start in the files' columns joined end to end
        joined_start = np.empty(len(lengths), dtype=np.int64)
        joined_start[file_order] = np.cumsum(lengths[file_order]) - lengths[file_order]
        gather = None
        if (file_order != np.arange(len(file_order))).any():
            gather = np.repeat(joined_start - self.starts, lengths) + np.arange(int(lengths.sum()))
        per_file = [_joined_columns(rows) for _, rows in files]
        out = {}
        for key in per_file[0]:
            parts = [columns[key] for columns in per_file]
            values = parts[0] if len(parts) == 1 else np.concatenate(parts)
            values = values if gather is None else values[gather]
            # an Arrow buffer seen through numpy is read-only: own a writable copy, as a concatenation gives
            out[key] = values if values.flags.writeable else values.copy()
        return out

    def _check_same_columns(self, meta: DatasetMeta, files: list[tuple[list[int], FileRows]]) -> None:
        """Every data file must hold the same columns: DatasetFormatError naming the file, episode and
        column, blaming a file that lacks a declared feature before one that has an undeclared extra."""
        names = [(positions, _column_names(rows)) for positions, rows in files]
        union = {key for _, columns in names for key in columns}
        declared = [k for k, f in meta.features.items() if k in union]
        for positions, columns in names:
            lacking = [k for k in declared if k not in columns]
            if lacking:
                ep = self.episodes[positions[0]]
                raise DatasetFormatError(
                    f"{ep.data_path}: episode {ep.index}: no column "
                    f"{', '.join(map(repr, lacking))}, which meta/info.json declares and other data files "
                    "have. `vla-io check` lists every such file"
                )
        for positions, columns in names:
            extra = [k for k in columns if k not in declared and any(k not in c for _, c in names)]
            if extra:
                ep = self.episodes[positions[0]]
                raise DatasetFormatError(
                    f"{ep.data_path}: episode {ep.index}: column "
                    f"{', '.join(map(repr, extra))}, which other data files lack and meta/info.json does not "
                    "declare"
                )

    @staticmethod
    def _read_file(
        path: str, episodes: list[Episode], positions: list[int], skip: set[str], strict: bool
    ) -> dict[int, dict[str, np.ndarray]]:
        """{position: {column: that episode's rows}} of one data file (views into the file's columns)."""
        rows = read_file_rows(path, episodes, skip, strict)
        return dict(zip(positions, _episode_columns(rows, [ep.length for ep in episodes])))
