"""LeRobotDataset: LeRobot conventions, exact frames (checked against direct PyAV decoding), edges, errors."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest
import torch
from vla_io import (
    DatasetFormatError,
    FrameTimestampError,
    LeRobotDataset,
    VideoDecodeError,
)
from vla_io.testing import read_frame_marker

FPS = 20
CHUNK = {"action": [i / FPS for i in range(6)]}


def test_gr1_sample_follows_lerobot_conventions(gr1_root):
    ds = LeRobotDataset(gr1_root, progress=False)
    assert len(ds) == 2096 and ds.num_episodes == 5 and ds.fps == 20
    # the declared 800x1280 camera has no files: ignored, as the dataset's SOURCE.md asks
    assert ds.video_keys == ["observation.images.ego_view"]
    sample = ds[420]
    image = sample["observation.images.ego_view"]
    assert (
        image.shape == (3, 256, 256)
        and image.dtype == torch.float32
        and image.min() >= 0
        and image.max() <= 1
    )
    assert sample["observation.state"].shape == (44,) and sample["observation.state"].dtype == torch.float32
    assert sample["episode_index"].item() == 1 and sample["frame_index"].item() == 4
    assert sample["task"] == "pick the sweet potato from the counter and place it in the plate"
    assert set(ds.meta.stats["action"]) >= {"mean", "std", "min", "max"}
    assert ds.meta.tasks[1] == "valid"


def test_gr1_missing_camera_is_an_error_only_when_asked_for(gr1_root):
    with pytest.raises(FileNotFoundError, match=r"egoview.*episode 0.*observation.images.egoview"):
        LeRobotDataset(gr1_root, video_keys=["observation.images.egoview"], progress=False)
    with pytest.raises(KeyError, match="unknown video keys"):
        LeRobotDataset(gr1_root, video_keys=["observation.images.nope"], progress=False)


def test_gr1_frames_equal_direct_pyav_decode(gr1_root, ref_frame):
    ds = LeRobotDataset(gr1_root, image_dtype="uint8", progress=False)
    rows = [0, 1, 415, 416, 1000, 2095, 7, 1355]
    batch = ds.get_batch(rows)
    for b, row in enumerate(rows):
        ep = ds.meta.episodes[int(batch["episode_index"][b])]
        seconds = int(batch["frame_index"][b]) / FPS
        expected = ref_frame(ep.videos["observation.images.ego_view"].path, seconds)
        assert np.array_equal(batch["observation.images.ego_view"][b].numpy(), expected), row


def test_gr1_shifted_timestamp_column_is_detected(gr1_root):
    # this dataset's `timestamp` column runs (i + 1) / fps: LeRobot's rule would ask for a frame past the
    # end of each video; with frame_time="timestamp" that is a clear error naming file, episode and key
    ds = LeRobotDataset(gr1_root, frame_time="timestamp", progress=False)
    with pytest.raises(
        FrameTimestampError, match=r"episode_000000.mp4: episode 0, key 'observation.images.ego_view'"
    ):
        ds[415]


def test_modality_slices_and_annotations(gr1_root):
    ds = LeRobotDataset(gr1_root, progress=False)
    modality = ds.meta.modality
    assert list(modality.slices("state")) == [
        "left_arm",
        "left_hand",
        "left_leg",
        "neck",
        "right_arm",
        "right_hand",
        "right_leg",
        "waist",
    ]
    sample = ds[3]
    parts = modality.split(sample, tasks=ds.meta.tasks)
    assert torch.equal(parts["state.right_arm"], sample["observation.state"][22:29])
    assert torch.equal(parts["video.ego_view"], sample["observation.images.ego_view"])
    assert parts["annotation.human.validity"] == "valid"
    assert parts["annotation.human.action.task_description"] == sample["task"]
    batch = ds.get_batch([0, 1])
    assert modality.split(batch)["action.waist"].shape == (2, 3)
    stats = modality.split_stats(ds.meta.stats)
    np.testing.assert_array_equal(
        stats["state.neck"]["mean"], np.asarray(ds.meta.stats["observation.state"]["mean"])[19:22]
    )


def test_frames_equal_direct_pyav_decode_and_carry_their_index(variant_root, ref_frame):
    ds = LeRobotDataset(variant_root, image_dtype="uint8", progress=False)
    rows = list(range(len(ds)))[::-3]  # unsorted, across every episode and file
    batch = ds.get_batch(rows)
    for b, row in enumerate(rows):
        ep = ds.meta.episode(int(batch["episode_index"][b]))
        for cam_index, key in enumerate(ds.video_keys):
            span = ep.videos[key]
            expected = ref_frame(span.path, span.from_timestamp + int(batch["frame_index"][b]) / FPS)
            frame = batch[key][b].numpy()
            assert np.array_equal(frame, expected), (row, key)
            assert read_frame_marker(frame) == (row, cam_index)


@pytest.mark.parametrize("backend", ["torchcodec", "pyav"])
def test_backends_agree_bit_for_bit(synth_root, backend, require_backend):
    require_backend(backend)
    root = synth_root("v3.0", "av1")
    rows = [5, 0, 33, 21, 54, 2]
    ref = LeRobotDataset(root, image_dtype="uint8", video_backend="pyav", progress=False).get_batch(rows)
    got = LeRobotDataset(root, image_dtype="uint8", video_backend=backend, progress=False).get_batch(rows)
    for key in ("observation.images.image", "observation.images.wrist_image"):
        assert torch.equal(ref[key], got[key])


def test_action_chunks_and_pads_at_episode_edges(variant_root):
    deltas = {**CHUNK, "observation.images.image": [-2 / FPS, 0.0], "observation.state": [-1 / FPS, 0.0]}
    ds = LeRobotDataset(variant_root, delta_timestamps=deltas, image_dtype="uint8", progress=False)
    bounds = ds.episode_bounds()
    for start, end in bounds:
        for row in (start, start + 1, end - 3, end - 1):
            s = ds[int(row)]
            want = np.arange(row, row + 6)
            assert s["action"].shape == (6, 7)
            np.testing.assert_array_equal(s["action_is_pad"].numpy(), want >= end)
            np.testing.assert_array_equal(s["action"][:, 0].numpy(), np.minimum(want, end - 1))
            past = np.array([row - 2, row])
            np.testing.assert_array_equal(s["observation.images.image_is_pad"].numpy(), past < start)
            markers = [read_frame_marker(f.numpy())[0] for f in s["observation.images.image"]]
            assert markers == np.maximum(past, start).tolist()
            np.testing.assert_array_equal(s["observation.state_is_pad"].numpy(), [row - 1 < start, False])


def test_float_images_are_uint8_over_255(synth_root):
    root = synth_root("v2.1", "h264")
    u8 = LeRobotDataset(root, image_dtype="uint8", progress=False)[7]["observation.images.image"]
    f32 = LeRobotDataset(root, progress=False)[7]["observation.images.image"]
    assert torch.equal(f32, u8.float() / 255)


def test_episode_subset_and_tasks(synth_root):
    ds = LeRobotDataset(synth_root("v3.0", "av1"), episodes=[2, 1], progress=False)
    assert ds.episode_indices == [1, 2]
    assert len(ds) == sum(e.length for e in ds.meta.episodes[1:])
    first = ds[0]
    assert (
        first["episode_index"].item() == 1
        and read_frame_marker((first["observation.images.image"] * 255).round().byte().numpy())[0]
        == first["index"].item()
    )
    assert first["task"] == ds.meta.tasks[1]
    with pytest.raises(KeyError, match="unknown episodes"):
        LeRobotDataset(synth_root("v3.0", "av1"), episodes=[9], progress=False)


def test_bad_delta_timestamps(synth_root):
    root = synth_root("v2.1", "av1")
    with pytest.raises(KeyError, match="'actions' is not a feature"):
        LeRobotDataset(root, delta_timestamps={"actions": [0.0]}, progress=False)
    with pytest.raises(ValueError, match=r"delta_timestamps\['action'\]: 0.033 s is not a multiple"):
        LeRobotDataset(root, delta_timestamps={"action": [0.033]}, progress=False)


def test_index_out_of_range(synth_root):
    ds = LeRobotDataset(synth_root("v2.1", "av1"), progress=False)
    with pytest.raises(IndexError):
        ds[len(ds)]


def _copy(root, tmp_path):
    return shutil.copytree(root, tmp_path / "copy")


def test_corrupt_video_names_file_episode_and_key(synth_root, tmp_path):
    root = _copy(synth_root("v2.1", "h264"), tmp_path)
    video = root / "videos/chunk-000/observation.images.wrist_image/episode_000001.mp4"
    video.write_bytes(b"\x00" * 4096)
    ds = LeRobotDataset(root, progress=False)
    with pytest.raises(
        VideoDecodeError, match=r"episode 1, key 'observation.images.wrist_image'.*episode_000001.mp4"
    ):
        ds[int(ds.episode_bounds()[1, 0])]
    ds[0]  # other episodes still load


def test_frame_count_mismatch_names_file_episode_and_key(synth_root, tmp_path):
    from vla_io.testing import VideoWriter

    root = _copy(synth_root("v2.1", "av1"), tmp_path)
    video = root / "videos/chunk-000/observation.images.image/episode_000002.mp4"
    with VideoWriter(video, "av1", FPS, 64, 64) as writer:  # too short: 5 frames for a longer episode
        for _ in range(5):
            writer.write(np.zeros((64, 64, 3), np.uint8))
    ds = LeRobotDataset(root, progress=False)
    with pytest.raises(
        DatasetFormatError,
        match=r"episode_000002.mp4: episode 2, key 'observation.images.image': the video has 5 frames",
    ):
        ds[len(ds) - 1]


def test_missing_or_inconsistent_metadata(synth_root, tmp_path):
    root = _copy(synth_root("v2.1", "av1"), tmp_path)
    (root / "data/chunk-000/episode_000001.parquet").unlink()
    with pytest.raises(DatasetFormatError, match="episode_000001.parquet: data file of episode 1 not found"):
        LeRobotDataset(root, progress=False)
    lines = (root / "meta/episodes.jsonl").read_text().splitlines()
    row = json.loads(lines[0])
    row["length"] += 1
    (root / "meta/episodes.jsonl").write_text("\n".join([json.dumps(row), *lines[1:]]) + "\n")
    with pytest.raises(DatasetFormatError, match="episode 0 has 20 rows but its metadata says length 21"):
        LeRobotDataset(root, episodes=[0], progress=False)
    info = json.loads((root / "meta/info.json").read_text())
    info["codebase_version"] = "v1.6"
    (root / "meta/info.json").write_text(json.dumps(info))
    with pytest.raises(DatasetFormatError, match="info.json: codebase_version 'v1.6'"):
        LeRobotDataset(root, progress=False)


def test_v30_missing_video_file(synth_root, tmp_path):
    root = _copy(synth_root("v3.0", "av1"), tmp_path)
    (root / "videos/observation.images.wrist_image/chunk-000/file-001.mp4").unlink()
    with pytest.raises(
        FileNotFoundError, match=r"file-001.mp4: video of episode 2, key 'observation.images.wrist_image'"
    ):
        LeRobotDataset(root, progress=False)
    ds = LeRobotDataset(root, video_keys=["observation.images.image"], progress=False)
    assert "observation.images.wrist_image" not in ds[len(ds) - 1]
