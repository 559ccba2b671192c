"""Decoded-frame cache: same frames as decoding, validated against the source."""

from __future__ import annotations

import os

import pytest
import torch
from vla_io import DatasetFormatError, LeRobotDataset
from vla_io.augment.torch_backend import resize_uint8
from vla_io.decode import FrameCache
from vla_io.decode.frame_cache import default_dir
from vla_io.testing import read_frame_marker


def test_cache_at_source_size_returns_identical_batches(synth_root, tmp_path, batches_equal):
    root = synth_root("v3.0", "h264")
    ds = LeRobotDataset(
        root, image_dtype="uint8", delta_timestamps={"observation.images.image": [-0.05, 0.0]}, progress=False
    )
    FrameCache.build(ds, directory=tmp_path / "c", progress=False)
    cached = FrameCache.open(ds, tmp_path / "c").attach(
        LeRobotDataset(
            root,
            image_dtype="uint8",
            delta_timestamps={"observation.images.image": [-0.05, 0.0]},
            progress=False,
        )
    )
    rows = [0, 1, 19, 20, 54, 33]
    batches_equal(ds.get_batch(rows), cached.get_batch(rows))


def test_cache_at_training_size(synth_root, tmp_path):
    root = synth_root("v2.1", "av1")
    ds = LeRobotDataset(root, image_dtype="uint8", progress=False)
    cache = FrameCache.build(
        ds, size=(48, 40), directory=tmp_path / "c", keys=["observation.images.wrist_image"], progress=False
    )
    assert cache.size == (48, 40)
    small = cache.attach(LeRobotDataset(root, image_dtype="uint8", progress=False)).get_batch([3, 30])
    assert small["observation.images.wrist_image"].shape == (2, 3, 48, 40)
    assert small["observation.images.image"].shape == (2, 3, 64, 64)  # not cached: decoded
    full = ds.get_batch([3, 30])["observation.images.wrist_image"]
    assert torch.equal(small["observation.images.wrist_image"], resize_uint8(full, (48, 40)))


def test_cache_rejects_changed_sources_and_partial_builds(synth_root, tmp_path):
    import shutil

    root = shutil.copytree(synth_root("v2.1", "h264"), tmp_path / "ds")
    ds = LeRobotDataset(root, image_dtype="uint8", progress=False)
    FrameCache.build(ds, progress=False)
    FrameCache.open(ds)  # default place: the user cache folder, never the dataset's
    video = root / "videos/chunk-000/observation.images.image/episode_000002.mp4"
    os.utime(video, ns=(0, 0))
    with pytest.raises(DatasetFormatError, match="source videos changed"):
        FrameCache.open(ds)
    assert not list(root.rglob("*manifest.json"))  # nothing written into the dataset
    (default_dir(ds, None) / "manifest.json").unlink()
    with pytest.raises(FileNotFoundError, match="no frame cache"):
        FrameCache.open(ds)


def test_cache_detects_wrong_content(synth_root, tmp_path):
    import numpy as np

    ds = LeRobotDataset(synth_root("v2.1", "av1"), image_dtype="uint8", progress=False)
    FrameCache.build(ds, directory=tmp_path / "c", keys=["observation.images.image"], progress=False)
    data = np.load(tmp_path / "c/observation.images.image.npy", mmap_mode="r+")
    data[:] = data[::-1].copy()  # every frame in the wrong place
    data.flush()
    with pytest.raises(DatasetFormatError, match="differ from the source"):
        FrameCache.open(ds, tmp_path / "c", check_frames=8)
    assert read_frame_marker(np.asarray(data[0])) != (0, 0)
