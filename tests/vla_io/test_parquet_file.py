"""read_parquet: the table pq.read_table gives for one file, without importing pyarrow.dataset."""

from __future__ import annotations

import subprocess
import sys

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from vla_io.dataset.parquet_file import read_parquet


@pytest.fixture
def path(tmp_path):
    path = tmp_path / "episode.parquet"
    table = pa.table(
        {"episode_index": [0, 0, 1], "state": [[0.5, 1.0], [1.5, 2.0], [2.5, 3.0]], "t": [0.0, 0.1, 0.0]}
    )
    pq.write_table(table, path, row_group_size=2)  # two row groups: the whole file, not the first group
    return path


def test_whole_file_and_chosen_columns_equal_read_table(path) -> None:
    assert read_parquet(path).equals(pq.read_table(path))
    assert read_parquet(path, ["t", "episode_index"]).equals(
        pq.read_table(path, columns=["t", "episode_index"])
    )


def test_a_missing_column_or_file_is_named(path, tmp_path) -> None:
    with pytest.raises(KeyError, match="'frame_index'"):
        read_parquet(path, ["episode_index", "frame_index"])
    with pytest.raises(FileNotFoundError):
        read_parquet(tmp_path / "absent.parquet")


def test_reading_does_not_import_pyarrow_dataset(path) -> None:
    code = (
        "import sys; from vla_io.dataset.parquet_file import read_parquet; "
        f"read_parquet({str(path)!r}); print('pyarrow.dataset' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "False"
