"""Joint groups from modality.json-shaped data (several features, non-finite statistics), and cameras of
different sizes and aspect ratios prepared per camera as the release does (letterbox, crop, resize)."""

from __future__ import annotations

import json
import math

import pytest
import torch
from gr00t_model import (
    EmbodimentSpec,
    GR00TConfig,
    GR00TProcessor,
    ImageSpec,
    ProcessorConfig,
    preprocess_images,
)

TINY = GR00TConfig.preset("tiny")


def _stats(width: int, low: float = -1.0, high: float = 1.0) -> dict:
    return {"min": [low] * width, "max": [high] * width, "mean": [0.0] * width, "std": [1.0] * width}


def test_groups_of_several_features_index_their_concatenation() -> None:
    modality = {
        "state": {
            "arm": {"start": 0, "end": 6, "original_key": "observation.joints"},
            "gripper": {"start": 0, "end": 1, "original_key": "observation.gripper"},
        },
        "action": {"action": {"start": 0, "end": 7}},  # original_key defaults to "action"
    }
    stats = {"observation.joints": _stats(6), "observation.gripper": _stats(1, 0, 2), "action": _stats(7)}
    spec = EmbodimentSpec.from_modality(modality, stats, "new_embodiment", action_horizon=4)
    assert [(g.name, g.start, g.end) for g in spec.state] == [("arm", 0, 6), ("gripper", 6, 7)]
    assert spec.state_features == [("observation.joints", 6), ("observation.gripper", 1)]
    assert spec.action_features == [("action", 7)]
    sample = {
        "observation.joints": torch.ones(2, 6),
        "observation.gripper": torch.full((2, 1), 2.0),
        "action": torch.zeros(2, 4, 7),
    }
    state = spec.gather_state(sample)
    assert state.shape == (2, 7)
    torch.testing.assert_close(spec.normalize_state(state), torch.ones(2, 7))  # max of each group -> 1
    assert spec.gather_action(sample).shape == (2, 4, 7)
    with pytest.raises(KeyError, match="observation.gripper"):
        spec.gather_state({"observation.joints": torch.ones(2, 6)})


@pytest.mark.parametrize("bad", [math.nan, math.inf])
def test_non_finite_statistics_are_an_error_naming_key_and_index(dataset_meta, tmp_path, bad) -> None:
    stats = json.loads((dataset_meta / "stats.json").read_text())
    stats["observation.state"]["min"][9] = bad  # joint 9: in the left_hand group [7:13]
    meta = tmp_path / "meta"
    meta.mkdir()
    (meta / "stats.json").write_text(json.dumps(stats))  # json writes NaN / Infinity
    (meta / "modality.json").write_text((dataset_meta / "modality.json").read_text())
    with pytest.raises(
        ValueError, match=r"'observation.state' 'min' is (nan|inf) at index 9 \(joint group 'left_hand'\)"
    ):
        EmbodimentSpec.from_lerobot_meta(meta, "gr1", action_horizon=16)
    # a statistic the group's mode does not use may be anything
    stats["observation.state"]["min"][9] = -1.0
    stats["observation.state"]["q01"] = [bad] * 44
    (meta / "stats.json").write_text(json.dumps(stats))
    EmbodimentSpec.from_lerobot_meta(meta, "gr1", action_horizon=16)
    with pytest.raises(ValueError, match=r"'q01' is (nan|inf) at index 0"):
        EmbodimentSpec.from_lerobot_meta(meta, "gr1", action_horizon=16, use_percentiles=True)


def test_letterbox_keeps_the_aspect_ratio() -> None:
    # a 32x64 white frame: letterboxed to 64x64 (black bars of 16 rows above and below), no crop
    spec = ImageSpec(size=(56, 56), crop_fraction=1.0)
    wide = torch.full((1, 3, 32, 64), 255, dtype=torch.uint8)
    out = preprocess_images([wide], spec)[0, 0]  # [3, 56, 56], normalized: white 1, black -1
    rows = out[0, :, 28]
    assert rows[0] == -1 and rows[-1] == -1 and rows[28] == 1  # bars, content in the middle
    white = (out[0] > 0).float().mean().item()
    assert abs(white - 0.5) < 0.05  # half of the square is picture, as 32 / 64
    stretched = preprocess_images([wide], ImageSpec(size=(56, 56), crop_fraction=1.0, letterbox=False))
    assert (stretched > 0.99).all()  # without letterboxing the frame would fill the square


def test_cameras_of_different_sizes_prepared_per_camera() -> None:
    gen = torch.Generator().manual_seed(1)
    front = torch.randint(0, 256, (3, 3, 48, 64), dtype=torch.uint8, generator=gen)  # 4:3
    wrist = torch.randint(0, 256, (3, 3, 32, 32), dtype=torch.uint8, generator=gen)  # square
    spec = ImageSpec(size=(56, 56))
    both = preprocess_images([front, wrist], spec)
    assert both.shape == (3, 2, 3, 56, 56)
    torch.testing.assert_close(both[:, 0], preprocess_images([front], spec)[:, 0])  # independent of the other
    torch.testing.assert_close(both[:, 1], preprocess_images(wrist[:, None], spec)[:, 0])


def test_processor_takes_a_list_of_cameras(dataset_meta) -> None:
    spec = EmbodimentSpec.from_lerobot_meta(dataset_meta, "gr1", action_horizon=16)
    gen = torch.Generator().manual_seed(2)
    front = torch.randint(0, 256, (2, 60, 80, 3), dtype=torch.uint8, generator=gen)  # channel-last, 4:3
    wrist = torch.randint(0, 256, (2, 3, 32, 32), dtype=torch.uint8, generator=gen)
    state = torch.zeros(2, 44)
    processor = GR00TProcessor(TINY, spec, config=ProcessorConfig(num_images=2))
    out = processor({"images": [front, wrist], "state": state}, tasks=["a", "b"])
    expected = preprocess_images([front, wrist], processor.image_spec)
    assert torch.equal(out["pixel_values"], expected) and expected.shape == (2, 2, 3, 56, 56)
    passthrough = GR00TProcessor(TINY, spec, config=ProcessorConfig(num_images=2, image_mode="passthrough"))
    assert passthrough({"images": [front, wrist], "state": state}, ["a", "b"])["images"][1] is wrist
    with pytest.raises(ValueError, match="one per camera"):
        processor({"images": [front], "state": state}, ["a", "b"])
