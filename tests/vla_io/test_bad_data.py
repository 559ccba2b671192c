"""Bad data on disk: `vla-io check` lists every bad file, episode and frame; the pipeline skips samples that
cannot be decoded (warning once per episode, counting them, resumable); an episode that is missing from the
episodes index is reported instead of silently ignored."""

from __future__ import annotations

import json
import logging
import multiprocessing
import os
import re
import shutil
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch
import vla_io
from vla_io.cli import main

IMAGE = "observation.images.image"
WRIST = "observation.images.wrist_image"


def _video(root: Path, key: str, episode: int) -> Path:
    return next(root.glob(f"videos/**/{key}/episode_{episode:06d}.mp4"))


def _truncate(path: Path) -> None:
    """A copy cut short (a full disk, an interrupted transfer): the first third of the file."""
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 3])


@pytest.fixture
def broken(synth_root, tmp_path) -> Path:
    """The v2.1 H.264 dataset with episode 1's main camera truncated."""
    root = tmp_path / "broken"
    shutil.copytree(synth_root("v2.1", "h264"), root)
    _truncate(_video(root, IMAGE, 1))
    return root


def test_a_clean_dataset_checks_clean(synth_root, capsys) -> None:
    root = synth_root("v3.0", "h264")
    report = vla_io.check_dataset(root, workers=2, progress=False)
    meta = vla_io.DatasetMeta(root)
    assert report.ok and report.problems == []
    assert report.frames_decoded == meta.total_frames * len(meta.video_keys)
    assert main(["check", str(root), "--no-progress"]) == 0
    assert "problems  none" in capsys.readouterr().out


def test_check_lists_every_bad_file_episode_and_frame(broken, capsys) -> None:
    # Three more kinds of damage: bytes zeroed inside a video, NaN actions, an episode missing from the index.
    wrist = _video(broken, WRIST, 0)
    data = bytearray(wrist.read_bytes())
    data[len(data) // 3 : len(data) // 3 + 1500] = bytes(1500)
    wrist.write_bytes(bytes(data))
    table_path = next(broken.glob("data/**/episode_000002.parquet"))
    table = pq.read_table(table_path)
    actions = table.column("action").to_pylist()
    actions[5] = [float("nan")] * len(actions[5])
    actions[6] = [float("inf")] * len(actions[6])
    column = table.schema.get_field_index("action")
    pq.write_table(
        table.set_column(column, "action", pa.array(actions, table.schema.field("action").type)), table_path
    )
    index = broken / "meta" / "episodes.jsonl"
    lines = index.read_text().splitlines()
    index.write_text("\n".join(lines[:2]) + "\n")  # episode 2 has data and videos but no index entry

    report = vla_io.check_dataset(broken, workers=2, progress=False)
    found = {(p.file.split("/")[-1], p.episode, p.key) for p in report.problems}
    assert ("episode_000001.mp4", 1, IMAGE) in found  # truncated: too few frames, the tail undecodable
    assert ("episode_000000.mp4", 0, WRIST) in found  # damaged in the middle
    assert ("episode_000002.parquet", 2, None) in found  # not in the index
    truncated = [p for p in report.problems if p.episode == 1]
    assert any("the video has" in p.reason for p in truncated) and any(p.frames for p in truncated)
    assert all(p.frames for p in report.problems if p.episode == 0)  # names the frames
    assert main(["check", str(broken), "--no-progress", "--workers", "1"]) == 1
    out = capsys.readouterr().out
    assert "episode_000001.mp4, episode 1, key 'observation.images.image'" in out
    # The NaN rows, by episode and frame (with episode 2 back in the index).
    index.write_text("\n".join(lines) + "\n")
    report = vla_io.check_dataset(broken, workers=1, progress=False)
    nan = [p for p in report.problems if p.key == "action"]
    assert [(p.episode, p.frames, p.reason) for p in nan] == [(2, "5-6", "NaN/inf values in 2 row(s)")]


def test_an_episode_missing_from_the_index_is_reported(synth_root, tmp_path, caplog) -> None:
    root = tmp_path / "unindexed"
    shutil.copytree(synth_root("v2.1", "h264"), root)
    index = root / "meta" / "episodes.jsonl"
    index.write_text("\n".join(index.read_text().splitlines()[:2]) + "\n")
    with caplog.at_level(logging.WARNING):
        dataset = vla_io.LeRobotDataset(root, progress=False)
    assert dataset.episode_indices == [0, 1]
    assert "1 episode(s) have data files but are missing from the episodes index" in caplog.text
    assert "2 (episode_000002.parquet)" in caplog.text


def _with_info(root: Path, source: Path, **fields) -> Path:
    """A copy of `source` whose meta/info.json has `fields` replaced."""
    shutil.copytree(source, root)
    path = root / "meta" / "info.json"
    path.write_text(json.dumps({**json.loads(path.read_text()), **fields}))
    return root


@pytest.mark.parametrize("fps", [0, -20, "twenty", None, float("nan"), True], ids=repr)
def test_a_bad_fps_is_rejected_when_the_metadata_loads(synth_root, tmp_path, capsys, fps) -> None:
    # fps 0 used to pass, then fail as a ZeroDivisionError in `vla-io info`, in every frame of `vla-io check`
    # and in training; a string failed as float()'s ValueError without naming the file.
    root = _with_info(tmp_path / "bad-fps", synth_root("v2.1", "h264"), fps=fps)
    expected = r"meta/info.json: field 'fps' must be a positive number, got "
    for load in (vla_io.DatasetMeta, lambda r: vla_io.LeRobotDataset(r, progress=False)):
        with pytest.raises(vla_io.DatasetFormatError, match=expected):
            load(root)
    for command in (["info", str(root)], ["check", str(root), "--no-progress", "--workers", "1"]):
        assert main(command) == 2
        captured = capsys.readouterr()
        assert "info.json: field 'fps' must be a positive number" in captured.err
        assert "ZeroDivisionError" not in captured.out + captured.err and "problems" not in captured.out


def test_a_zero_chunks_size_is_rejected(synth_root, tmp_path) -> None:
    root = _with_info(tmp_path / "bad-chunks", synth_root("v2.1", "h264"), chunks_size=0)
    with pytest.raises(vla_io.DatasetFormatError, match="info.json: field 'chunks_size' must be a positive"):
        vla_io.DatasetMeta(root)


@pytest.mark.parametrize("version", ["v2.1", "v3.0"])
def test_a_task_index_without_a_task_is_an_error_naming_file_episode_and_rows(
    synth_root, tmp_path, caplog, capsys, version
) -> None:
    # task_index 99 (the tasks are 0-3) used to become an empty prompt in silence; `vla-io check` said nothing.
    root = tmp_path / "bad-task"
    shutil.copytree(synth_root(version, "h264"), root)
    meta = vla_io.DatasetMeta(root)
    episode = meta.episodes[1]
    table = pq.read_table(episode.data_path)
    rows = np.flatnonzero(table.column("episode_index").to_numpy() == 1)[[2, 3]]  # episode 1, frames 2-3
    task_index = table.column("task_index").to_numpy().copy()
    task_index[rows] = 99
    column = table.schema.get_field_index("task_index")
    pq.write_table(table.set_column(column, "task_index", pa.array(task_index)), episode.data_path)
    name = episode.data_path.name
    tasks_file = "meta/tasks.parquet" if version == "v3.0" else "meta/tasks.jsonl"
    reason = f"task_index 99 is not in {tasks_file} (task indices 0-3)"

    with pytest.raises(
        vla_io.DatasetFormatError, match=re.escape(f"{name}: episode 1, frames 2-3: {reason}")
    ):
        vla_io.LeRobotDataset(root, progress=False)
    with caplog.at_level(logging.WARNING):
        lenient = vla_io.LeRobotDataset(root, progress=False, strict=False, image_dtype="uint8")
    assert f"{name}: episode 1, frames 2-3: {reason}" in caplog.text
    start = int(lenient.episode_bounds()[1, 0])
    assert lenient[start + 1]["task"] == meta.tasks[int(task_index[rows[0] - 1])]  # its neighbour reads
    with pytest.raises(vla_io.DatasetFormatError, match=re.escape(f"{name}: episode 1, frame 3: {reason}")):
        lenient.get_batch([0, start + 3])
    skipping = vla_io.Pipeline(
        lenient, 4, synchronous=True, shuffle=False, device="cpu", skip_bad_samples=True
    )
    assert all("" not in batch["task"] for batch in skipping)
    assert skipping.state_dict()["skipped_samples"] == 2

    report = vla_io.check_dataset(root, workers=1, progress=False)
    assert [(p.file, p.episode, p.key, p.frames) for p in report.problems] == [
        (str(episode.data_path.relative_to(root)), 1, "task_index", "2-3")
    ]
    assert main(["check", str(root), "--no-progress", "--workers", "1"]) == 1
    assert f"key 'task_index', frames 2-3: {reason} in 2 row(s)" in capsys.readouterr().out


def _edit_column(path: Path, name: str, edit) -> None:
    """Rewrite column `name` of a parquet file with edit(values) (a numpy copy of the column)."""
    table = pq.read_table(path)
    values = edit(table.column(name).to_numpy().copy())
    index = table.schema.get_field_index(name)
    pq.write_table(table.set_column(index, name, pa.array(values, table.schema.field(name).type)), path)


def test_check_reports_timestamp_gaps_but_not_a_constant_offset(synth_root, tmp_path) -> None:
    # Before: a gap (a dropped frame: every later timestamp one step late) passed `vla-io check` in silence,
    # while the default frame_time="index" reads video frames and delta_timestamps windows by row.
    root = tmp_path / "timestamps"
    shutil.copytree(synth_root("v2.1", "h264"), root)
    fps = vla_io.DatasetMeta(root).fps

    def gap(t):
        t[5:] += 1 / fps
        t[12] += 0.5 / fps  # and one timestamp off by half a step: two more bad steps
        return t

    _edit_column(next(root.glob("data/**/episode_000001.parquet")), "timestamp", gap)
    _edit_column(next(root.glob("data/**/episode_000002.parquet")), "timestamp", lambda t: t + 0.5)
    report = vla_io.check_dataset(root, workers=1, progress=False)
    found = [(p.episode, p.key, p.frames) for p in report.problems]
    assert found == [(1, "timestamp", "5, 12-13")]  # the later frame of each bad step; episode 2 is fine
    assert "timestamps are not 1/fps = 0.0500 s apart at 3 step(s), e.g. 0.1000 s from frame 4 to 5" in (
        report.problems[0].reason
    )


def test_an_episode_index_column_that_disagrees_with_the_index_names_its_values(synth_root, tmp_path) -> None:
    # It was an error before too, but it said only "0 rows": now it says what the file's column holds.
    root = tmp_path / "episode-index"
    shutil.copytree(synth_root("v2.1", "h264"), root)
    path = next(root.glob("data/**/episode_000001.parquet"))
    _edit_column(path, "episode_index", lambda e: e * 0 + 7)
    expected = (
        "episode_000001.parquet: episode 1 has 0 rows but its metadata says length 17 "
        "(the file's 'episode_index' values: 7)"
    )
    with pytest.raises(vla_io.DatasetFormatError, match=re.escape(expected)):
        vla_io.LeRobotDataset(root, progress=False)
    report = vla_io.check_dataset(root, workers=1, progress=False)
    assert [p.line() for p in report.problems] == [f"data/chunk-000/{expected}"]


def _epoch(pipeline) -> list[dict]:
    return [{k: (v.clone() if isinstance(v, torch.Tensor) else v) for k, v in b.items()} for b in pipeline]


def test_the_pipeline_skips_undecodable_samples(broken, batches_equal, caplog) -> None:
    dataset = vla_io.LeRobotDataset(broken, image_dtype="uint8", progress=False)
    bad = {i for i in range(len(dataset)) if dataset.sample_location(i)[0] == 1}
    options = dict(seed=3, device="cpu", skip_bad_samples=True)
    with caplog.at_level(logging.WARNING):
        sync = vla_io.Pipeline(dataset, 4, synchronous=True, **options)
        reference = _epoch(sync)
    delivered = [i for b in range(len(sync)) for i in sync.sampler.task(0, b).indices.tolist()]
    assert sync.state_dict()["skipped_samples"] == len(bad & set(delivered)) > 0  # each of episode 1
    assert all(1 not in b["episode_index"].tolist() for b in reference)  # replaced by readable samples
    warnings = [r.getMessage() for r in caplog.records if "which cannot be decoded" in r.getMessage()]
    assert len(warnings) == 1 and "(episode 1, frame " in warnings[0]  # once per episode
    assert "episode_000001.mp4" in warnings[0] and "skipped sample" in warnings[0]
    assert "skipped_samples" not in reference[0]  # the notes never reach the caller

    # Worker processes deliver the same batches (the substitutes are deterministic) and the same count.
    with vla_io.Pipeline(dataset, 4, num_workers=2, **options) as workers:
        for a, b in zip(reference, _epoch(workers), strict=True):
            batches_equal(a, b)
        assert workers.state_dict()["skipped_samples"] == sync.state_dict()["skipped_samples"]

    # Resuming mid-epoch continues the count and the batches.
    resumed = vla_io.Pipeline(dataset, 4, synchronous=True, **options)
    first = iter(resumed)
    for _ in range(5):
        next(first)
    state = resumed.state_dict()
    again = vla_io.Pipeline(dataset, 4, synchronous=True, **options)
    again.load_state_dict(state)
    rest = _epoch(again)
    for a, b in zip(reference[5:], rest, strict=True):
        batches_equal(a, b)
    assert again.state_dict()["skipped_samples"] == sync.state_dict()["skipped_samples"]


def test_without_skipping_the_batch_fails_naming_the_file(broken) -> None:
    dataset = vla_io.LeRobotDataset(broken, image_dtype="uint8", progress=False)
    with pytest.raises(vla_io.DatasetFormatError, match="episode_000001.mp4: episode 1"):
        _epoch(vla_io.Pipeline(dataset, 4, synchronous=True, seed=3, device="cpu"))


def test_a_dataset_without_readable_samples_still_fails(synth_root, tmp_path) -> None:
    root = tmp_path / "all-bad"
    shutil.copytree(synth_root("v2.1", "h264"), root)
    for video in root.glob("videos/**/*.mp4"):
        _truncate(video)
    dataset = vla_io.LeRobotDataset(root, image_dtype="uint8", progress=False)
    pipeline = vla_io.Pipeline(dataset, 2, synchronous=True, device="cpu", skip_bad_samples=True)
    with pytest.raises(vla_io.VlaIoError, match="and 16 substitute samples failed too"):
        next(iter(pipeline))


def test_substitutes_are_spread_and_deterministic() -> None:
    from vla_io.pipeline.skips import substitute

    picks = [substitute(7, attempt, 1000) for attempt in range(1, 17)]
    assert picks == [substitute(7, attempt, 1000) for attempt in range(1, 17)]
    assert len(set(picks)) > 12 and np.ptp(picks) > 500
    assert json.dumps(picks)  # plain ints


def test_a_stalled_worker_raises_after_the_timeout_and_is_stopped(synth_root, tmp_path) -> None:
    # Opening a FIFO without a writer blocks forever: a decoder hung on its file, as on a dead network mount.
    root = tmp_path / "stalled"
    shutil.copytree(synth_root("v2.1", "h264"), root)
    video = _video(root, IMAGE, 0)
    video.unlink()
    os.mkfifo(video)
    dataset = vla_io.LeRobotDataset(root, image_dtype="uint8", progress=False)
    pipeline = vla_io.Pipeline(dataset, 32, num_workers=1, timeout_s=1.0, device="cpu", shuffle=False)
    workers = multiprocessing.active_children
    with pytest.raises(vla_io.WorkerTimeoutError) as info:
        next(iter(pipeline))
    assert info.value.timeout_s == 1.0 and "had not delivered batch (0, 0)" in info.value.detail
    assert "raise PipelineConfig.timeout_s" in str(info.value)
    pipeline.close()
    assert not [p for p in workers() if p.name.startswith("vla-io-worker")]
