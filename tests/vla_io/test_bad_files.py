"""Every bad file of the fault campaign is caught: `vla-io check` names its file, episode and frames and exits 1
(never crashing), and reading it either skips the bad samples naming them (`skip_bad_samples`) or refuses
the dataset naming the file. The cases: a video at another size than its camera's other videos, a data
file without a column, an episode of zero frames, a camera whose videos all differ from info.json."""

from __future__ import annotations

import logging
import re
import shutil
from pathlib import Path

import _bad_files as bad
import pytest
import torch
import vla_io
from vla_io.cli import main
from vla_io.testing import SynthConfig, write_synthetic_dataset

IMAGE = "observation.images.image"


CONFIG = SynthConfig(episodes=3, episode_length=20, image_size=64, codec="h264")  # v2.1: a file per episode


@pytest.fixture(scope="module")
def written(tmp_path_factory) -> Path:
    return write_synthetic_dataset(
        tmp_path_factory.mktemp("synth-64"), CONFIG, overwrite=True, progress=False
    )


@pytest.fixture(scope="module")
def large(tmp_path_factory) -> Path:
    """The same dataset written at 96x96: the same episodes, frames and times at another size."""
    root = tmp_path_factory.mktemp("synth-96")
    return write_synthetic_dataset(root, CONFIG.with_(image_size=96), overwrite=True, progress=False)


@pytest.fixture
def copy(written, tmp_path) -> Path:
    """A private copy of the 64x64 dataset, to break."""
    root = tmp_path / "dataset"
    shutil.copytree(written, root)
    return root


def _check(root: Path, capsys) -> str:
    """`vla-io check` must find problems (exit 1, not 2: it did not fail itself); returns its report."""
    assert main(["check", str(root), "--no-progress", "--workers", "1"]) == 1
    captured = capsys.readouterr()
    assert "Traceback" not in captured.out + captured.err
    return captured.out


def _epoch(pipeline) -> list[dict]:
    return list(pipeline)


def test_a_video_at_another_size_is_reported_and_its_samples_skipped(copy, large, capsys, caplog) -> None:
    # Before: decoding raised a clear error, but the skip path torch.cat-ed the per-sample rows of mixed sizes
    # (a raw RuntimeError), and `vla-io check` said "problems none".
    path = bad.video_at_another_size(copy, large, IMAGE, 1)
    length = vla_io.DatasetMeta(copy).episodes[1].length
    name = str(path.relative_to(copy))
    report = _check(copy, capsys)
    assert (
        f"{name}, episode 1, key '{IMAGE}', frames 0-{length - 1}: {length} frame(s) are 96x96 (height x width) "
        "where this camera's are 64x64" in report
    )

    dataset = vla_io.LeRobotDataset(copy, image_dtype="uint8", progress=False)
    episode_1 = {i for i in range(len(dataset)) if dataset.sample_location(i)[0] == 1}
    with pytest.raises(vla_io.VideoDecodeError, match=re.escape(f"{path}: episode 1, key '{IMAGE}', frame")):
        _epoch(vla_io.Pipeline(dataset, 4, synchronous=True, seed=3, device="cpu"))
    pipeline = vla_io.Pipeline(dataset, 4, synchronous=True, seed=3, device="cpu", skip_bad_samples=True)
    with caplog.at_level(logging.WARNING):
        batches = _epoch(pipeline)
    assert all(tuple(b[IMAGE].shape[-2:]) == (64, 64) for b in batches)
    assert all(1 not in b["episode_index"].tolist() for b in batches)  # each replaced by a good sample
    delivered = {i for b in range(len(pipeline)) for i in pipeline.sampler.task(0, b).indices.tolist()}
    assert pipeline.state_dict()["skipped_samples"] == len(episode_1 & delivered) > 0
    warned = [r.getMessage() for r in caplog.records if "skipped sample" in r.getMessage()]
    assert len(warned) == 1 and "(episode 1, frame " in warned[0]
    assert f"{path}: episode 1, key '{IMAGE}', frame " in warned[0] and "are 96x96" in warned[0]


class _Squares(torch.utils.data.Dataset):
    """A plain dataset (no get_batch, no size check of its own) whose sample 5 has a smaller image."""

    def __len__(self) -> int:
        return 12

    def __getitem__(self, index: int) -> dict:
        side = 4 if index == 5 else 8
        return {"image": torch.full((3, side, side), index, dtype=torch.uint8), "index": torch.tensor(index)}


def test_a_sample_of_another_shape_from_a_plain_dataset_is_skipped(caplog) -> None:
    plain = vla_io.Pipeline(_Squares(), 4, synchronous=True, shuffle=False, device="cpu")
    with pytest.raises(
        vla_io.DatasetFormatError, match=r"key 'image': sample 1 of the batch has shape \(3, 4, 4\)"
    ):
        _epoch(plain)  # collate names the key and the shapes, not torch.stack's message
    skipping = vla_io.Pipeline(
        _Squares(), 4, synchronous=True, shuffle=False, device="cpu", skip_bad_samples=True
    )
    with caplog.at_level(logging.WARNING):
        batches = _epoch(skipping)
    indices = torch.cat([b["index"] for b in batches]).tolist()
    assert (
        5 not in indices
        and len(indices) == 12
        and indices[:5] + indices[6:] == [0, 1, 2, 3, 4, *range(6, 12)]
    )
    assert skipping.state_dict()["skipped_samples"] == 1
    assert (
        "skipped sample 5 " in caplog.text
        and "has shape (3, 4, 4) where the batch's other samples" in caplog.text
    )


def test_a_data_file_without_a_column_is_reported_and_refused(copy, capsys) -> None:
    # Before: `vla-io check` said "problems none" (training refused it, with a message of its own).
    path = bad.without_column(copy, 1, "action")
    name = str(path.relative_to(copy))
    report = _check(copy, capsys)
    assert f"{name}, episode 1, key 'action', frames all: no such column" in report
    with pytest.raises(vla_io.DatasetFormatError, match=re.escape(f"{path}: episode 1: no column 'action'")):
        vla_io.LeRobotDataset(copy, progress=False)
    for episode in (0, 2):  # every file without it: one problem, on the metadata that declares it
        bad.without_column(copy, episode, "action")
    report = _check(copy, capsys)
    assert "meta/info.json, key 'action': declares feature 'action' (float32[7]), but no data file" in report


def test_a_zero_frame_episode_is_reported_and_skipped(copy, capsys, caplog) -> None:
    # Before: `vla-io check` crashed ("cannot reshape array of size 0") and reading failed in np.concatenate.
    path = bad.zero_frame_episode(copy, 1)
    report = _check(copy, capsys)
    assert (
        f"{path.relative_to(copy)}, episode 1: the episode has no frames (length 0 in the episodes index"
        in report
    )
    assert "problems  1" in report  # its video, holding frames the index no longer counts, is not read
    with caplog.at_level(logging.WARNING):
        dataset = vla_io.LeRobotDataset(copy, image_dtype="uint8", progress=False)
    assert dataset.episode_indices == [0, 2]
    assert (
        f"1 episode(s) have no frames (length 0 in the episodes index) and are skipped: 1 ({path.relative_to(copy)})"
        in (caplog.text)
    )
    pipeline = vla_io.Pipeline(dataset, 2, synchronous=True, device="cpu", shuffle=False, drop_last=False)
    rows = [
        (e, f)
        for b in _epoch(pipeline)
        for e, f in zip(b["episode_index"].tolist(), b["frame_index"].tolist())
    ]
    assert sorted(rows) == [(e.index, f) for e in vla_io.DatasetMeta(copy).episodes for f in range(e.length)]


def test_a_camera_whose_videos_all_differ_from_info_json_is_read_at_their_size(
    copy, large, capsys, caplog
) -> None:
    # Before: it trained without a word. Its frames agree with each other, so they are read at their real
    # size (the image transform resizes any size), with a warning; `vla-io check` reports the metadata.
    bad.all_videos_at_another_size(copy, large, IMAGE)
    report = _check(copy, capsys)
    assert "problems  1" in report
    assert (
        f"meta/info.json, key '{IMAGE}': declares 64x64 (height x width), but no video of this camera"
        in report
    )
    with caplog.at_level(logging.WARNING):
        dataset = vla_io.LeRobotDataset(copy, image_dtype="uint8", progress=False)
    assert (
        f"camera '{IMAGE}': its videos are 96x96 (height x width) but meta/info.json declares 64x64"
        in caplog.text
    )
    pipeline = vla_io.Pipeline(dataset, 4, synchronous=True, device="cpu", skip_bad_samples=True)
    batches = _epoch(pipeline)
    assert all(tuple(b[IMAGE].shape[-2:]) == (96, 96) for b in batches)
    assert all(tuple(b["observation.images.wrist_image"].shape[-2:]) == (64, 64) for b in batches)
    assert pipeline.state_dict()["skipped_samples"] == 0


def test_a_check_that_fails_is_a_problem_of_its_file_not_a_crash(copy, capsys, monkeypatch) -> None:
    from vla_io.decode import check

    def crash(path, episode, key, *rest):
        if episode == 2 and key == IMAGE:
            raise MemoryError("the decoder ran out of memory")
        return real(path, episode, key, *rest)

    real = check._check_video
    monkeypatch.setattr(check, "_check_video", crash)
    report = _check(copy, capsys)
    video = bad.video(copy, IMAGE, 2).relative_to(copy)
    assert (
        f"{video}, episode 2, key '{IMAGE}', frames all: the check failed (MemoryError: the decoder ran"
        in report
    )
    assert "problems  1" in report
