"""FrameTable reads each data file once and gathers episodes' rows with index arrays: its columns must be
the very bytes a plain per-episode reader gives (rows taken episode by episode, each converted on its own),
on a v3.0 dataset whose files are shared by several episodes, whole, in part, scrambled; and a bad file
must still fail with the message that names its first bad episode."""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from vla_io import DatasetFormatError, DatasetMeta
from vla_io.dataset.table import FrameTable, column_to_numpy, read_file_rows
from vla_io.testing import SynthConfig, write_synthetic_dataset

# nine episodes of 11-12 frames, four to a data file: files 0 and 1 hold four episodes each, file 2 one
CONFIG = SynthConfig(
    episodes=9, episode_length=12, image_size=64, episodes_per_file=4, version="v3.0", codec="h264",
    cameras=("image",),
)  # fmt: skip


@pytest.fixture(scope="module")
def shared_root(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("frame-table") / "plain"
    write_synthetic_dataset(root, CONFIG, overwrite=True, progress=False)
    # two more column types: text (object arrays) and float64 (returned as float32)
    for path in sorted(root.glob("data/**/*.parquet")):
        table = pq.read_table(path)
        notes = [f"row {i}" for i in table["index"].to_pylist()]
        reward = np.asarray(table["index"].to_numpy(), dtype=np.float64) / 3.0
        pq.write_table(
            table.append_column("note", pa.array(notes)).append_column("reward", pa.array(reward)), path
        )
    return root


def reference_columns(meta: DatasetMeta, indices: list[int]) -> dict[str, np.ndarray]:
    """The plain reader: each episode's rows found, taken and converted on their own, then concatenated."""
    skip = set(meta.video_keys) | set(meta.image_keys)
    parts = []
    for index in indices:
        episode = meta.episode(index)
        table = pq.read_table(episode.data_path)
        rows = np.flatnonzero(table["episode_index"].to_numpy() == index)
        assert len(rows) == episode.length
        part = table.take(pa.array(rows))
        parts.append({n: column_to_numpy(part[n], n) for n in part.column_names if n not in skip})
    return {k: np.concatenate([p[k] for p in parts]) for k in parts[0]}


def assert_same_bytes(
    got: dict[str, np.ndarray], want: dict[str, np.ndarray], writeable: bool = True
) -> None:
    assert list(got) == list(want)
    for key in want:
        assert got[key].dtype == want[key].dtype and got[key].shape == want[key].shape, key
        if want[key].dtype == object:
            assert got[key].tolist() == want[key].tolist(), key
        else:
            assert got[key].tobytes() == want[key].tobytes(), key
        assert got[key].flags.writeable or not writeable, key  # FrameTable's columns own their memory


def _write_rows(path: Path, table: pa.Table, rows: list[int]) -> None:
    pq.write_table(table.take(pa.array(rows, type=pa.int64())), path)


def _rows_of(table: pa.Table, episode: int) -> list[int]:
    return np.flatnonzero(table["episode_index"].to_numpy() == episode).tolist()


@pytest.fixture(scope="module")
def scrambled_root(shared_root, tmp_path_factory) -> Path:
    """The same rows, stored otherwise: episodes 1 and 4 swap data files (so a file's episodes are not
    neighbours in episode order), blocks stored in reverse, and episodes 0 and 2 interleaved row by row."""
    root = tmp_path_factory.mktemp("frame-table") / "scrambled"
    shutil.copytree(shared_root, root)
    files = sorted(root.glob("data/**/*.parquet"))
    first, second = pq.read_table(files[0]), pq.read_table(files[1])
    both = pa.concat_tables([first, second])
    zero, two = _rows_of(both, 0), _rows_of(both, 2)
    interleaved = [r for pair in zip(zero, two) for r in pair] + zero[len(two) :] + two[len(zero) :]
    _write_rows(files[0], both, _rows_of(both, 4) + _rows_of(both, 3) + interleaved)
    _write_rows(files[1], both, _rows_of(both, 7) + _rows_of(both, 6) + _rows_of(both, 5) + _rows_of(both, 1))
    episodes_path = next(root.glob("meta/episodes/**/*.parquet"))
    index = pq.read_table(episodes_path)
    file_index = index["data/file_index"].to_pylist()
    file_index[1], file_index[4] = 1, 0
    position = index.schema.get_field_index("data/file_index")
    index = index.set_column(
        position, "data/file_index", pa.array(file_index, index.schema.field(position).type)
    )
    pq.write_table(index, episodes_path)
    return root


@pytest.mark.parametrize("layout", ["shared", "scrambled"])
@pytest.mark.parametrize("selection", [None, [1, 4, 5, 8], [6]], ids=["all", "some", "one"])
def test_columns_are_the_plain_readers_bytes(shared_root, scrambled_root, layout, selection) -> None:
    root = shared_root if layout == "shared" else scrambled_root
    meta = DatasetMeta(root)
    indices = selection or [e.index for e in meta.episodes]
    table = FrameTable(meta, [meta.episode(i) for i in indices], progress=False)
    want = reference_columns(meta, indices)
    assert_same_bytes(table.columns, want)
    lengths = [meta.episode(i).length for i in indices]
    assert table.starts.tolist() == np.cumsum([0] + lengths[:-1]).tolist()
    assert table.row_episode.tolist() == np.repeat(np.arange(len(indices)), lengths).tolist()
    for path in {str(meta.episode(i).data_path) for i in indices}:  # the one-pass reader took every file
        episodes = [meta.episode(i) for i in indices if str(meta.episode(i).data_path) == path]
        assert isinstance(read_file_rows(path, episodes, set(meta.video_keys), strict=True), dict)
    # and every row sits where it did in the dataset as written (its global `index` says so)
    plain = DatasetMeta(shared_root)
    assert_same_bytes(table.columns, reference_columns(plain, indices))


def test_the_per_file_reader_of_check_gives_each_episode_its_rows(scrambled_root) -> None:
    meta = DatasetMeta(scrambled_root)
    positions = [p for p, e in enumerate(meta.episodes) if e.data_path == meta.episode(0).data_path]
    episodes = [meta.episodes[p] for p in positions]
    assert [e.index for e in episodes] == [0, 2, 3, 4]
    parts = FrameTable._read_file(str(episodes[0].data_path), episodes, positions, set(meta.video_keys), True)
    assert list(parts) == positions
    for pos, episode in zip(positions, episodes):
        assert_same_bytes(parts[pos], reference_columns(meta, [episode.index]), writeable=False)


def _rewrite(root: Path, file: int, change) -> Path:
    path = sorted(root.glob("data/**/*.parquet"))[file]
    pq.write_table(change(pq.read_table(path)), path)
    return path


def _set(table: pa.Table, name: str, values: list) -> pa.Table:
    position = table.schema.get_field_index(name)
    return table.set_column(position, name, pa.array(values, table.schema.field(position).type))


def _open(root: Path) -> None:
    meta = DatasetMeta(root)
    FrameTable(meta, meta.episodes, progress=False)


def _break_frame_index(table: pa.Table, episode: int) -> pa.Table:
    frame_index = table["frame_index"].to_pylist()
    frame_index[_rows_of(table, episode)[1]] = 7
    return _set(table, "frame_index", frame_index)


def _drop_last_row(table: pa.Table, episode: int) -> pa.Table:
    last = _rows_of(table, episode)[-1]
    return table.take(pa.array([r for r in range(table.num_rows) if r != last]))


def test_a_bad_file_names_its_first_bad_episode(scrambled_root, tmp_path) -> None:
    # file 0 holds episodes 4, 3, then 0 and 2 interleaved. Episode 2 short of a row and episode 3 with a
    # broken frame_index: episode 2 comes first in episode order, so it is named, as the plain reader did.
    both = tmp_path / "both"
    shutil.copytree(scrambled_root, both)
    length = DatasetMeta(both).episode(2).length
    path = _rewrite(both, 0, lambda t: _drop_last_row(_break_frame_index(t, 3), 2))
    expected = (
        f"{path}: episode 2 has {length - 1} rows but its metadata says length {length} "
        "(the file's 'episode_index' values: 0, 2-4)"
    )
    with pytest.raises(DatasetFormatError, match=re.escape(expected)):
        _open(both)
    frame_only = tmp_path / "frame-index"
    shutil.copytree(scrambled_root, frame_only)
    length = DatasetMeta(frame_only).episode(3).length
    path = _rewrite(frame_only, 0, lambda t: _break_frame_index(t, 3))
    with pytest.raises(
        DatasetFormatError, match=re.escape(f"{path}: episode 3: 'frame_index' is not 0..{length - 1}")
    ):
        _open(frame_only)
    meta = DatasetMeta(frame_only)  # strict=False lets it through, rows as stored
    table = FrameTable(meta, meta.episodes, strict=False, progress=False)
    assert_same_bytes(table.columns, reference_columns(meta, [e.index for e in meta.episodes]))


def test_null_values_are_named_by_episode_and_key(scrambled_root, tmp_path) -> None:
    root = tmp_path / "nulls"
    shutil.copytree(scrambled_root, root)

    def null_action(table: pa.Table) -> pa.Table:
        actions = table["action"].to_pylist()
        actions[_rows_of(table, 6)[2]] = None
        return _set(table, "action", actions)

    path = _rewrite(root, 1, null_action)
    with pytest.raises(DatasetFormatError, match=re.escape(f"{path}: episode 6, key 'action': 1 null rows")):
        _open(root)
