"""Synthetic datasets: LeRobot layouts on disk, real mp4 files whose frames carry their index."""

from __future__ import annotations

import json
import os

import numpy as np
import pyarrow.parquet as pq
import pytest
import vla_io
from vla_io.testing import SYNTH_PRESETS, SynthConfig, VideoWriter, read_frame_marker


def test_v21_layout_files(synth_root):
    root = synth_root("v2.1", "av1")
    info = json.loads((root / "meta/info.json").read_text())
    assert info["codebase_version"] == "v2.1" and info["total_episodes"] == 3
    for name in ("episodes.jsonl", "tasks.jsonl", "episodes_stats.jsonl", "stats.json", "modality.json"):
        assert (root / "meta" / name).exists(), name
    for ep in range(3):
        assert (root / f"data/chunk-000/episode_{ep:06d}.parquet").exists()
        for cam in ("image", "wrist_image"):
            assert (root / f"videos/chunk-000/observation.images.{cam}/episode_{ep:06d}.mp4").exists()


def test_v30_layout_files(synth_root):
    root = synth_root("v3.0", "h264")
    assert sorted(p.name for p in (root / "data/chunk-000").iterdir()) == [
        "file-000.parquet",
        "file-001.parquet",
    ]
    episodes = pq.read_table(root / "meta/episodes/chunk-000/file-000.parquet").to_pydict()
    assert episodes["data/file_index"] == [0, 0, 1]
    lengths = episodes["length"]
    # the second episode starts in its file right after the first one
    assert episodes["videos/observation.images.image/from_timestamp"] == [0.0, lengths[0] / 20, 0.0]
    assert episodes["dataset_from_index"] == [0, lengths[0], lengths[0] + lengths[1]]
    tasks = pq.read_table(root / "meta/tasks.parquet")
    assert (
        b"pandas" in tasks.schema.metadata and tasks.column("task").to_pylist()[0] == SynthConfig().tasks[0]
    )


@pytest.mark.parametrize("codec", ["av1", "h264"])
def test_every_frame_carries_its_index(synth_root, codec):
    import av

    root = synth_root("v3.0", codec)
    for cam_index, cam in enumerate(("image", "wrist_image")):
        seen = []
        for file in sorted((root / f"videos/observation.images.{cam}/chunk-000").glob("*.mp4")):
            with av.open(str(file)) as container:
                seen += [read_frame_marker(f.to_ndarray(format="rgb24")) for f in container.decode(video=0)]
        assert seen == [
            (i, cam_index) for i in range(sum(SynthConfig(episodes=3, episode_length=20).lengths()))
        ]


def test_rows_identify_themselves_and_stats_match(synth_root):
    root = synth_root("v2.1", "av1")
    table = pq.read_table(root / "data/chunk-000/episode_000001.parquet").to_pydict()
    state = np.asarray(table["observation.state"])
    assert (state[:, 0] == np.asarray(table["index"])).all() and (state[:, 1] == 1).all()
    assert (state[:, 2] == np.arange(len(state))).all()
    stats = json.loads((root / "meta/stats.json").read_text())
    all_actions = np.concatenate(
        [
            np.asarray(pq.read_table(p).column("action").to_pylist())
            for p in sorted((root / "data/chunk-000").glob("*.parquet"))
        ]
    )
    np.testing.assert_allclose(stats["action"]["mean"], all_actions.mean(0), rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(stats["action"]["max"], all_actions.max(0))
    assert np.asarray(stats["observation.images.image"]["mean"]).shape == (3, 1, 1)


def test_libero_preset_matches_the_brief():
    cfg = SYNTH_PRESETS["libero"]
    assert (cfg.image_size, cfg.cameras, cfg.state_dim, cfg.action_dim, cfg.fps) == (
        256,
        ("image", "wrist_image"),
        8,
        7,
        20,
    )
    assert len(cfg.tasks) >= 3


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"version": "v2.5"}, "version"),
        ({"codec": "vp9"}, "codec"),
        ({"image_size": 32}, "64"),
        ({"episodes": 0}, "episodes"),
    ],
)
def test_config_errors_name_the_field(change, field):
    with pytest.raises(ValueError, match=field):
        SynthConfig(**change)


def test_refuses_to_overwrite(tmp_path):
    (tmp_path / "x").write_text("keep me")
    with pytest.raises(FileExistsError, match="overwrite"):
        vla_io.write_synthetic_dataset(
            tmp_path, SynthConfig(episodes=1, episode_length=2, image_size=64), progress=False
        )
    assert (tmp_path / "x").read_text() == "keep me"


def test_marker_rejects_unmarked_frames():
    with pytest.raises(ValueError, match="marker"):
        read_frame_marker(np.full((64, 64, 3), 128, np.uint8))


@pytest.mark.skipif(not hasattr(os, "sched_getscheduler"), reason="no POSIX thread scheduling here")
@pytest.mark.parametrize("codec", ["av1", "h264"])
def test_encoding_leaves_the_thread_scheduling_alone(tmp_path, codec):
    # SVT-AV1 lifts the calling thread to SCHED_FIFO 99 where it may (as root); spawned workers then inherit
    # it and a spinning thread can starve the machine. The writer must put the policy back.
    before = (os.sched_getscheduler(0), os.sched_getparam(0))
    with VideoWriter(tmp_path / "v.mp4", codec, fps=10, width=64, height=64) as writer:
        for i in range(4):
            writer.write(np.full((64, 64, 3), i * 40, np.uint8))
            assert (os.sched_getscheduler(0), os.sched_getparam(0)) == before
    assert (os.sched_getscheduler(0), os.sched_getparam(0)) == before
