"""`gr00t-train` on each bad file of the fault campaign: it skips the bad samples naming them and finishes
within `data.max_bad_fraction` (exit 2 past it), or refuses the dataset naming the file, and never dies
with a raw error."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import _bad_files as bad
import pytest
import vla_io
from gr00t_train.cli import main

IMAGE = "observation.images.image"
pytestmark = pytest.mark.slow  # each runs `gr00t-train train` on the demo model for a few steps


@pytest.fixture(scope="module")
def large(dataset, tmp_path_factory) -> Path:
    """The end-to-end dataset (conftest's) written again at 96x96: the same episodes, frames and times."""
    root = tmp_path_factory.mktemp("data-96") / "libero-like"
    config = vla_io.testing.SynthConfig(episodes=3, episode_length=24, image_size=96, codec="h264")
    vla_io.write_synthetic_dataset(root, config, progress=False)
    lengths = [[e.length for e in vla_io.DatasetMeta(r).episodes] for r in (dataset, root)]
    assert lengths[0] == lengths[1]
    return root


def _train(train_args, dataset: Path, out: Path, capsys, *sets: str) -> tuple[int, str]:
    code = main(train_args(dataset, out, "steps=2", *sets))
    err = capsys.readouterr().err
    assert "Traceback" not in err
    return code, err


def test_a_video_at_another_size_is_skipped_within_the_budget(
    dataset_copy, large, tmp_path, train_args, capsys, caplog
) -> None:
    # Before: the skip path torch.cat-ed frames of two sizes: a raw RuntimeError, exit 1.
    path = bad.video_at_another_size(dataset_copy, large, IMAGE, 1)
    out = tmp_path / "run"
    with caplog.at_level(logging.WARNING):
        code, err = _train(train_args, dataset_copy, out, capsys, "data.max_bad_fraction=0.5")
    assert code == 0, err[-3000:]
    assert json.loads((out / "summary.json").read_text())["skipped_samples"] > 0
    warned = [r.getMessage() for r in caplog.records if "skipped sample" in r.getMessage()]
    assert len(warned) == 1 and "(episode 1, frame " in warned[0]
    assert f"{path}: episode 1, key '{IMAGE}', frame " in warned[0] and "are 96x96" in warned[0]
    # A third of the samples: past the default budget (1%), the run stops naming the setting.
    code, err = _train(train_args, dataset_copy, tmp_path / "strict", capsys)
    assert code == 2 and "more than data.max_bad_fraction=0.01 allows" in err and "vla-io check" in err


def test_a_data_file_without_the_action_column_is_refused_naming_it(
    dataset_copy, tmp_path, train_args, capsys
) -> None:
    path = bad.without_column(dataset_copy, 1, "action")
    code, err = _train(train_args, dataset_copy, tmp_path / "run", capsys)
    assert code == 2 and f"{path}: episode 1: no column 'action', which meta/info.json declares" in err
    assert not (tmp_path / "run" / "checkpoints").exists()


def test_a_zero_frame_episode_is_skipped_naming_it(
    dataset_copy, tmp_path, train_args, capsys, caplog
) -> None:
    # Before: reading the table failed with numpy's concatenate message. One episode held out: never it.
    path = bad.zero_frame_episode(dataset_copy, 1)
    out = tmp_path / "run"
    with caplog.at_level(logging.WARNING):
        code, err = _train(train_args, dataset_copy, out, capsys, "data.val_episodes=1")
    assert code == 0, err[-3000:]
    assert f"are skipped: 1 ({path.relative_to(dataset_copy)})" in caplog.text
    assert json.loads((out / "summary.json").read_text())["skipped_samples"] == 0


def test_a_camera_whose_videos_all_differ_from_info_json_trains_at_their_size(
    dataset_copy, large, tmp_path, train_args, capsys, caplog
) -> None:
    # Before: it trained without a word. Now it trains the same way (the model's image step resizes any
    # size), warning that info.json is wrong; `vla-io check` reports it.
    bad.all_videos_at_another_size(dataset_copy, large, IMAGE)
    out = tmp_path / "run"
    with caplog.at_level(logging.WARNING):
        code, err = _train(train_args, dataset_copy, out, capsys)
    assert code == 0, err[-3000:]
    assert f"camera '{IMAGE}': its videos are 96x96 (height x width) but meta/info.json declares 64x64" in (
        caplog.text
    )
    assert json.loads((out / "summary.json").read_text())["skipped_samples"] == 0
