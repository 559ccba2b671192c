"""Reading one parquet file whole, or some of its columns.

pq.read_table(path) reads a single file through pyarrow.dataset, whose import alone costs about a second of
every start-up; pq.ParquetFile reads the same table without it.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq


def read_parquet(path: str | Path, columns: Sequence[str] | None = None) -> pa.Table:
    """The table in parquet file `path` (all columns, or `columns` in that order). Raises FileNotFoundError
    for a missing file and KeyError naming a column the file does not hold (ParquetFile alone would return
    the table without it)."""
    with pq.ParquetFile(path) as file:
        if columns is not None:
            missing = [name for name in columns if name not in file.schema_arrow.names]
            if missing:
                raise KeyError(f"{path}: no column {', '.join(map(repr, missing))}")
        return file.read(columns=None if columns is None else list(columns))
