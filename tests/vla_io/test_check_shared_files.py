"""`vla-io check` on LeRobot v3.0 files shared by many episodes: each (video file, camera) is opened once and
every episode's frame range in it checked, a damaged episode is reported for itself alone, and a file is
split over several jobs only when there are fewer files than workers."""

from __future__ import annotations

import os
import shutil
from collections import Counter

import numpy as np
import pyarrow.parquet as pq
import pytest
from vla_io import check_dataset
from vla_io.dataset import DatasetMeta
from vla_io.decode import check, check_video
from vla_io.decode.check_video import EpisodeSpan, _split, plan_video_jobs
from vla_io.testing import SynthConfig, write_synthetic_dataset

IMAGE = "observation.images.image"
SHARED = SynthConfig(
    version="v3.0", episodes=12, episode_length=16, image_size=64, pool_episodes=2, codec="h264",
    video_file_size_mb=0.02, data_file_size_mb=0.02,
)  # fmt: skip


@pytest.fixture(scope="module")
def shared(tmp_path_factory):
    root = tmp_path_factory.mktemp("shared") / "ds"
    return write_synthetic_dataset(root, SHARED, progress=False, workers=1)


@pytest.fixture
def copy(shared, tmp_path):
    root = tmp_path / "ds"
    shutil.copytree(shared, root)
    return root


def _files(meta):
    """{(video file, camera): the episodes in it}."""
    files: dict[tuple[str, str], list[int]] = {}
    for ep in meta.episodes:
        for key, span in ep.videos.items():
            files.setdefault((str(span.path), key), []).append(ep.index)
    return files


def test_each_file_is_opened_once_and_every_frame_checked(shared, monkeypatch):
    meta = DatasetMeta(shared)
    files = _files(meta)
    assert len(files) >= 4 and all(len(eps) >= 2 for eps in files.values())  # shared files
    opened = Counter()
    real = check_video.open_reader

    def counting(path, **kwargs):
        opened[path] += 1
        return real(path, **kwargs)

    monkeypatch.setattr(check_video, "open_reader", counting)
    report = check_dataset(shared, workers=1, progress=False)
    assert report.problems == []
    assert opened == Counter({path: 1 for path, _ in files})  # one open per (file, camera) job
    assert report.videos == len(files)
    assert report.frames_decoded == meta.total_frames * len(meta.video_keys)


def test_jobs_split_a_file_only_when_files_are_fewer_than_workers(shared):
    meta = DatasetMeta(shared)
    files = _files(meta)
    for workers in (1, len(files), 3 * len(files)):
        jobs = plan_video_jobs(meta, "pyav", workers)
        per_file: dict[tuple[str, str], list[int]] = {}
        for job in jobs:
            firsts = [s.first for s in job.spans]
            assert firsts == sorted(firsts) and job.spans
            per_file.setdefault((job.path, job.key), []).extend(s.episode for s in job.spans)
        assert {f: sorted(eps) for f, eps in per_file.items()} == files  # every episode once per camera
        if workers <= len(files):
            assert len(jobs) == len(files)
        else:
            assert len(files) < len(jobs) <= len(meta.episodes) * len(meta.video_keys)


def test_split_gives_runs_of_about_equal_frames():
    spans = [EpisodeSpan(i, 10 * i, 10, False) for i in range(10)]
    runs = _split(spans, 3)
    assert [s for run in runs for s in run] == spans and len(runs) == 3
    assert all(3 <= len(run) <= 4 for run in runs)
    assert _split(spans[:2], 5) == [(spans[0],), (spans[1],)]  # never an empty run
    uneven = [EpisodeSpan(0, 0, 100, False)] + [EpisodeSpan(i, 90 + 10 * i, 10, False) for i in range(1, 11)]
    assert [len(run) for run in _split(uneven, 2)] == [1, 10]


def _shift_episode(root, episode: int, key: str, frames: int) -> None:
    """Move `episode`'s frames in its video file `frames` later in the episodes index."""
    for path in sorted(root.glob("meta/episodes/*/*.parquet")):
        table = pq.read_table(path)
        rows = table.column("episode_index").to_pylist()
        if episode not in rows:
            continue
        row = rows.index(episode)
        fps = DatasetMeta(root).fps
        for end in ("from", "to"):
            name = f"videos/{key}/{end}_timestamp"
            values = table.column(name).to_numpy().copy()
            values[row] += frames / fps
            table = table.set_column(table.schema.get_field_index(name), name, [values])
        pq.write_table(table, path)


@pytest.mark.parametrize("workers", [1, 3])
def test_an_episode_past_its_files_end_is_reported_and_the_others_checked(copy, workers):
    meta = DatasetMeta(copy)
    files = _files(meta)
    (path, _), episodes = next((f, eps) for f, eps in files.items() if f[1] == IMAGE and len(eps) >= 3)
    victim = episodes[-1]  # the last episode of its file: moved half past the end
    length = meta.episodes[victim].length
    _shift_episode(copy, victim, IMAGE, length // 2)
    report = check_dataset(copy, workers=workers, progress=False)
    assert {(p.episode, p.key) for p in report.problems} == {(victim, IMAGE)}
    reasons = " ".join(p.reason for p in report.problems)
    assert "the episode needs frames" in reasons and "beyond the end of the video" in reasons
    assert any(p.frames == f"{length - length // 2}-{length - 1}" for p in report.problems)
    # every other episode's frames were decoded, and the victim's up to the end of its file
    assert report.frames_decoded == meta.total_frames * len(meta.video_keys) - length // 2


@pytest.mark.parametrize("workers", [1, 3])
def test_a_failing_episode_check_does_not_hide_its_files_other_episodes(shared, monkeypatch, workers):
    meta = DatasetMeta(shared)
    (path, _), episodes = next((f, eps) for f, eps in _files(meta).items() if f[1] == IMAGE and len(eps) >= 3)
    victim = episodes[1]  # in the middle of its file
    real = check._check_video

    def crash(path, episode, key, *rest):
        if episode == victim and key == IMAGE:
            raise MemoryError("the decoder ran out of memory")
        return real(path, episode, key, *rest)

    monkeypatch.setattr(check, "_check_video", crash)  # forked workers inherit it
    report = check_dataset(shared, workers=workers, progress=False)
    assert [(p.episode, p.key, p.frames) for p in report.problems] == [(victim, IMAGE, "all")]
    assert "the check failed (MemoryError" in report.problems[0].reason
    expected = meta.total_frames * len(meta.video_keys) - meta.episodes[victim].length
    assert report.frames_decoded == expected
    assert np.isfinite(report.seconds)


def test_a_dying_worker_loses_only_the_episodes_it_had_not_finished(shared, monkeypatch):
    meta = DatasetMeta(shared)
    (path, _), episodes = next((f, eps) for f, eps in _files(meta).items() if f[1] == IMAGE and len(eps) >= 3)
    victim = episodes[1]
    real = check._check_video

    def die(path, episode, key, *rest):
        if episode == victim and key == IMAGE:
            os._exit(1)  # as a decoder's segfault would
        return real(path, episode, key, *rest)

    monkeypatch.setattr(check, "_check_video", die)
    report = check_dataset(shared, workers=2, progress=False)
    assert all("the checking process died" in p.reason for p in report.problems)
    in_file = {p.episode for p in report.problems if p.key == IMAGE and p.file.endswith(path[-20:])}
    assert victim in in_file and episodes[0] not in in_file  # its result arrived before the crash
