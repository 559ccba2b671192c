"""Datasets written by LeRobot's own writer (tests/data/lerobot-written: lerobot 0.4.4's v3.0 with two AV1
cameras of different size and aspect in one file per camera, lerobot 0.3.3's v2.1 with one AV1 camera), as a
user brings them: no modality.json, read-only. vla-io decodes the frame written at each (episode, frame),
`vla-io check` finds nothing wrong, and `gr00t-train train` runs with only data.dataset and data.cameras
set, augmentation on."""

from __future__ import annotations

import importlib.util
import math
import shutil
from pathlib import Path

import numpy as np
import pytest
import vla_io
from _readonly import read_only
from gr00t_train.cli import main

DATA = Path(__file__).resolve().parents[1] / "data" / "lerobot-written"
CAMERAS = {"v3.0-two-cameras": "front,wrist", "v2.1-one-camera": "cam"}


def _writer():
    spec = importlib.util.spec_from_file_location("lerobot_writer", DATA / "write.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("name", CAMERAS)
def test_every_decoded_frame_is_the_one_written(name) -> None:
    # Nearest of the written images of every episode and of the frames two either side: AV1 at LeRobot's
    # settings keeps the right one within about 3/255 on average, far below the gap to any neighbour.
    image = _writer().image
    dataset = vla_io.LeRobotDataset(DATA / name, image_dtype="uint8", progress=False)
    episodes = len(dataset.meta.episodes)
    # each episode's first two, middle and last two frames: where per-episode offsets into a shared file show
    starts = np.cumsum([0] + [e.length for e in dataset.meta.episodes])
    picks = sorted(
        {int(a + k) for a, b in zip(starts, starts[1:]) for k in (0, 1, (b - a) // 2, b - a - 2, b - a - 1)}
    )
    for index in picks:
        sample = dataset[index]
        episode, frame = int(sample["episode_index"]), int(sample["frame_index"])
        for key in dataset.meta.video_keys:
            got = np.asarray(sample[key]).transpose(1, 2, 0).astype(np.float32)
            height, width = got.shape[:2]
            distance = {
                (e, f): float(np.abs(got - image(height, width, f, e)).mean())
                for e in range(episodes)
                for f in range(max(0, frame - 2), frame + 3)
            }
            assert min(distance, key=distance.get) == (episode, frame), (name, key, index)
            assert distance[(episode, frame)] < 6.0, (name, key, index, distance[(episode, frame)])


@pytest.mark.parametrize("name", CAMERAS)
def test_trains_as_it_is_read_only(name, tmp_path, losses) -> None:
    root = tmp_path / name
    shutil.copytree(DATA / name, root)  # read_only() changes file modes: on a copy, not the repository
    out = tmp_path / "run"
    sets = [f"data.dataset={root}", f"data.cameras={CAMERAS[name]}", "device=cpu", "steps=3",
            "data.batch_size=2", "data.num_workers=1", "data.augment=true", f"output_dir={out}",
            "logging.progress=false"]  # fmt: skip
    with read_only(root):
        report = vla_io.check_dataset(root, workers=1, progress=False)
        assert not report.problems, report.problems
        argv = ["train", "--preset", "demo"]
        for item in sets:
            argv += ["--set", item]
        assert main(argv) == 0
    values = losses(out)
    assert sorted(values) == [1, 2, 3] and all(math.isfinite(v) for v in values.values())
