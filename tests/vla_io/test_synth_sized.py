"""Sized v3.0 synthetic datasets (`SynthConfig.video_file_size_mb`): files rolled over near the size limit
as LeRobot rolls them, many episodes each, every episode's frames copied from its pool episode at the right
times, the rows right, a clean `vla-io check`, and a pipeline that opens each file once per worker."""

from __future__ import annotations

import json
import os

import numpy as np
import pyarrow.parquet as pq
import pytest
import torch
from vla_io import LeRobotDataset, Pipeline, check_dataset
from vla_io.cli import main as cli_main
from vla_io.dataset import DatasetMeta
from vla_io.dataset.file_groups import file_group_keys
from vla_io.decode.readers import ReaderCache
from vla_io.testing import SynthConfig, read_frame_marker, write_synthetic_dataset
from vla_io.testing.synth_content import ContentGenerator
from vla_io.testing.synth_sized import MIB, plan_files, pool_frame_index

VIDEO_MB, DATA_MB = 0.05, 0.02  # small limits: several files of many 64x64 episodes each
SIZED = SynthConfig(
    version="v3.0", episodes=40, episode_length=24, image_size=64, pool_episodes=4,
    video_file_size_mb=VIDEO_MB, data_file_size_mb=DATA_MB,
)  # fmt: skip


@pytest.fixture(scope="module")
def sized_root(tmp_path_factory):
    root = tmp_path_factory.mktemp("sized") / "ds"
    return write_synthetic_dataset(root, SIZED, progress=False, workers=2)  # through the process pool


def _episodes(root):
    return pq.read_table(root / "meta/episodes/chunk-000/file-000.parquet").to_pydict()


def test_plan_files_rolls_over_as_lerobot_does():
    assert plan_files([1, 1, 1, 1], 2.5) == [0, 0, 1, 1]
    assert plan_files([1, 0.5, 1], 1.5) == [0, 1, 2]  # reaching the limit exactly starts a new file
    assert plan_files([3, 0.5, 0.5], 2) == [0, 1, 1]  # an episode above the limit still gets a file


def test_files_are_near_the_limit_and_hold_many_episodes(sized_root):
    episodes = _episodes(sized_root)
    info = json.loads((sized_root / "meta/info.json").read_text())
    assert (info["video_files_size_in_mb"], info["data_files_size_in_mb"]) == (VIDEO_MB, DATA_MB)
    assert info["total_episodes"] == 40 and not list(sized_root.glob(".synth-pool-*"))  # pool removed
    for key in ("videos/observation.images.image", "videos/observation.images.wrist_image", "data"):
        numbers = np.asarray(episodes[f"{key}/file_index"])
        assert (np.diff(numbers) >= 0).all() and numbers[-1] >= 2, key  # in order, 3 files or more
        assert min(np.bincount(numbers)) >= 3, key  # many episodes per file
    for camera in ("image", "wrist_image"):
        sizes = [
            p.stat().st_size / MIB for p in sorted(sized_root.glob(f"videos/*.{camera}/chunk-000/*.mp4"))
        ]
        assert all(VIDEO_MB * 0.7 < s < VIDEO_MB for s in sizes[:-1]), sizes  # the last one holds the rest
    data = [p.stat().st_size / MIB for p in sorted(sized_root.glob("data/chunk-000/*.parquet"))]
    # planned from the average row size of the whole table: a small file's own footer costs a few KiB more
    assert all(DATA_MB * 0.7 < s < DATA_MB * 1.2 for s in data[:-1]), data


def test_every_episode_shows_its_pool_episode_at_the_right_times(sized_root):
    ds = LeRobotDataset(sized_root, image_dtype="uint8", progress=False)
    batch = ds.get_batch(np.arange(len(ds)))
    episode, frame = batch["episode_index"].numpy(), batch["frame_index"].numpy()
    lengths = SIZED.lengths()
    starts = np.concatenate([[0], np.cumsum(lengths)[:-1]])
    # markers on every frame of the pool episodes and on the first and last frame of every other one ...
    ends = np.cumsum(lengths)
    rows = np.union1d(np.arange(ends[SIZED.pool_episodes - 1]), np.concatenate([starts, ends - 1]))
    for cam, key in enumerate(ds.video_keys):
        markers = [read_frame_marker(batch[key][r].numpy()) for r in rows]
        assert markers == [(pool_frame_index(SIZED, int(episode[r]), int(frame[r])), cam) for r in rows]
        frames = batch[key]  # ... and every other frame equal to its pool episode's
        for e in range(SIZED.pool_episodes, SIZED.episodes):  # bit for bit the frames of its pool episode
            p = e % SIZED.pool_episodes
            assert lengths[e] == lengths[p]
            mine, pool = (
                frames[starts[e] : starts[e] + lengths[e]],
                frames[starts[p] : starts[p] + lengths[p]],
            )
            assert torch.equal(mine, pool), (key, e)
    spans = _episodes(sized_root)
    for key in ds.video_keys:  # each file's episodes follow one another at 1/fps
        begin, end = (np.asarray(spans[f"videos/{key}/{t}_timestamp"]) for t in ("from", "to"))
        files = np.asarray(spans[f"videos/{key}/file_index"])
        np.testing.assert_allclose(end - begin, np.asarray(lengths) / SIZED.fps)
        same = files[1:] == files[:-1]
        np.testing.assert_allclose(begin[1:][same], end[:-1][same])
        assert (begin[1:][~same] == 0).all() and begin[0] == 0


def test_rows_are_the_generators_rows(sized_root):
    table = pq.read_table(sorted(sized_root.glob("data/chunk-000/*.parquet"))).to_pydict()
    gen, start = ContentGenerator(SIZED), 0
    rows = {k: np.asarray(v) for k, v in table.items()}
    for e, length in enumerate(SIZED.lengths()):
        expected = gen.rows(e, start, length)
        for name, values in expected.items():
            np.testing.assert_array_equal(rows[name][start : start + length], values, err_msg=name)
        start += length
    assert len(rows["index"]) == start


def test_stats_cover_the_whole_dataset(sized_root):
    stats = json.loads((sized_root / "meta/stats.json").read_text())
    meta = DatasetMeta(sized_root)
    actions = np.asarray(
        pq.read_table(sorted(sized_root.glob("data/chunk-000/*.parquet"))).column("action").to_pylist()
    )
    np.testing.assert_allclose(stats["action"]["mean"], actions.mean(0), rtol=1e-5, atol=1e-6)
    assert stats["index"]["max"] == [meta.total_frames - 1]
    image = np.asarray(stats["observation.images.image"]["mean"])
    assert image.shape == (3, 1, 1) and ((image > 0) & (image < 1)).all()
    episodes = _episodes(sized_root)
    np.testing.assert_allclose(
        np.asarray(episodes["stats/action/mean"])[7], actions[sum(SIZED.lengths()[:7]) :][: SIZED.lengths()[7]].mean(0),
        rtol=1e-5, atol=1e-6,
    )  # fmt: skip


def test_check_finds_no_problems(sized_root):
    report = check_dataset(sized_root, workers=1, progress=False)
    assert report.ok, report.table()


class _CountingDataset(LeRobotDataset):
    """Each sample carries its worker's pid and reader counts (open now, opened so far)."""

    def get_batch(self, indices, *, image_dtype=None, shared_memory=False):
        batch = super().get_batch(indices, image_dtype=image_dtype, shared_memory=shared_memory)
        s = self._fetcher.readers.stats()
        batch["readers"] = torch.tensor([[os.getpid(), s["open"], s["opened"]]] * len(indices))
        return batch


def test_a_pipeline_opens_each_file_once_per_worker(sized_root):
    ds = _CountingDataset(sized_root, image_dtype="uint8", progress=False)
    files = {str(ep.videos[k].path) for ep in ds.meta.episodes for k in ds.video_keys}
    seen: dict[int, tuple[int, int]] = {}
    samples = 0
    with Pipeline(ds, 16, num_workers=2, seed=0, device="cpu") as pipe:
        for _ in range(2):
            for batch in pipe:
                samples += len(batch["readers"])
                for pid, open_now, opened in batch["readers"].tolist():
                    seen[pid] = (
                        max(open_now, seen.get(pid, (0, 0))[0]),
                        max(opened, seen.get(pid, (0, 0))[1]),
                    )
    assert len(seen) == 2 and samples >= 2 * (len(ds) // 16) * 16
    for open_now, opened in seen.values():
        assert open_now <= len(files) and opened <= len(files)  # never a file opened twice
    assert sum(opened for _, opened in seen.values()) * 20 < samples


def test_reader_cache_counts_opens_and_evictions_per_process(sized_root):
    paths = [str(p) for p in sorted(sized_root.glob("videos/*.image/chunk-000/*.mp4"))][:3]
    cache = ReaderCache(max_open=2, backend="pyav")
    for path in [*paths, paths[-1], paths[0]]:
        cache.get(path)
    assert cache.stats() == {"open": 2, "opened": 4, "evicted": 2}
    pid = os.fork()
    if pid == 0:  # a worker counts its own opens from zero
        os._exit(0 if cache.stats() == {"open": 0, "opened": 0, "evicted": 0} else 1)
    assert os.waitpid(pid, 0)[1] == 0


def test_file_group_keys_follow_the_files(sized_root, synth_root):
    meta = DatasetMeta(sized_root)
    keys = file_group_keys(meta.episodes, meta.video_keys)
    files = [tuple(str(ep.videos[k].path) for k in meta.video_keys) for ep in meta.episodes]
    for a in range(len(files)):
        for b in range(len(files)):
            assert (keys[a] == keys[b]) == (files[a] == files[b])
    assert len(set(keys.tolist())) < len(meta.episodes) // 3  # v3.0: many episodes per key
    v21 = DatasetMeta(synth_root("v2.1", "av1"))
    assert len(set(file_group_keys(v21.episodes, v21.video_keys).tolist())) == len(v21.episodes)
    assert file_group_keys(v21.episodes, []).tolist() == list(range(len(v21.episodes)))


def test_cli_writes_a_sized_dataset(tmp_path, capsys):
    code = cli_main(
        ["synth", str(tmp_path / "ds"), "--preset", "tiny", "--version", "v3.0", "--episodes", "12",
         "--video-file-size-mb", "0.02", "--data-file-size-mb", "0.01", "--pool-episodes", "2", "--workers", "1"]
    )  # fmt: skip
    assert code == 0 and "12 episodes" in capsys.readouterr().out
    assert len(list((tmp_path / "ds/videos/observation.images.image/chunk-000").glob("*.mp4"))) >= 2
    assert len(LeRobotDataset(tmp_path / "ds", progress=False)) == sum(
        SynthConfig(
            episodes=12, episode_length=24, pool_episodes=2, video_file_size_mb=1, version="v3.0"
        ).lengths()
    )


@pytest.mark.parametrize(
    "changes, message",
    [
        ({"version": "v2.1", "video_file_size_mb": 1.0}, "sizes v3.0 files"),
        ({"version": "v3.0", "video_file_size_mb": 0.0}, "video_file_size_mb must be > 0"),
        ({"version": "v3.0", "video_file_size_mb": 1.0, "data_file_size_mb": -1.0}, "data_file_size_mb"),
        ({"version": "v3.0", "pool_episodes": 0}, "pool_episodes must be >= 1"),
    ],
)
def test_bad_sizes_are_refused(changes, message):
    with pytest.raises(ValueError, match=message):
        SynthConfig(**changes)


def test_v30_workers_keep_their_files_when_the_files_outnumber_a_workers_cache(sized_root):
    """Routed by file, not by episode: with a cache smaller than the dataset's files, each worker still
    reads only its own files and never closes one (by episode, every worker read every file, reopening
    files for nearly every sample)."""
    meta = DatasetMeta(sized_root)
    files = len({str(ep.videos[k].path) for ep in meta.episodes for k in meta.video_keys})
    ds = _CountingDataset(sized_root, image_dtype="uint8", max_open_videos=files - 1, progress=False)
    assert ds.prefers_affinity()
    seen: dict[int, int] = {}
    with Pipeline(ds, 16, num_workers=2, seed=0, device="cpu") as pipe:
        for _ in range(2):
            for batch in pipe:
                for pid, _, opened in batch["readers"].tolist():
                    seen[pid] = max(opened, seen.get(pid, 0))
    assert len(seen) == 2 and all(opened < files for opened in seen.values())
