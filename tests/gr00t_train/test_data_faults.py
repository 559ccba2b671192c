"""Bad data and bad settings name what is wrong: non-finite raw values (with episode and frame), cameras the
dataset really has, the action feature used as state, and non-finite losses told truthfully per rank; and
features chosen by data.state_keys / data.action_keys map to their joint groups."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from gr00t_train._errors import DataError, NonFiniteLossError
from gr00t_train._run_checks import describe_nonfinite, tag_samples
from gr00t_train.data.dataset import check_finite
from gr00t_train.data.features import map_features


def _meta(video_keys=("observation.images.front", "observation.images.wrist"), state=True):
    features = {
        "action": {"dtype": "float32", "shape": [7]},
        "observation.joints": {"dtype": "float32", "shape": [6]},
    }
    if state:
        features["observation.state"] = {"dtype": "float32", "shape": [8]}
    for key in video_keys:
        features[key] = {"dtype": "video", "shape": [64, 64, 3]}
    return SimpleNamespace(features=features, video_keys=list(video_keys))


def _cfg(**data):
    base = dict(cameras=None, state_keys=None, action_keys=None, modality_file=None)
    return SimpleNamespace(data=SimpleNamespace(**{**base, **data}))


def test_an_unknown_camera_lists_only_the_datasets_own_cameras(tmp_path) -> None:
    with pytest.raises(DataError) as err:
        map_features(_cfg(cameras=["image"]), _meta(), tmp_path)
    assert str(err.value).endswith("camera 'image' is not in dataset " + f"{tmp_path}; it has front, wrist")


def test_modality_cameras_pointing_to_missing_keys_are_listed_apart(tmp_path) -> None:
    modality = tmp_path / "modality.json"
    modality.write_text('{"video": {"front": {"original_key": "observation.images.missing"}}}')
    with pytest.raises(DataError) as err:
        map_features(_cfg(cameras=["front"], modality_file=str(modality)), _meta(), tmp_path)
    message = str(err.value)
    assert "it has front, wrist;" in message
    assert "point to a video feature it does not have: front -> observation.images.missing" in message


def test_the_action_feature_cannot_also_be_state(tmp_path) -> None:
    cfg = _cfg(state_keys=["observation.joints", "action"])
    with pytest.raises(DataError, match=r"data.state_keys: 'action' is the action feature"):
        map_features(cfg, _meta(state=False), tmp_path)


def test_state_and_action_keys_choose_non_default_features_as_joint_groups(tmp_path) -> None:
    """Issue 13: features other than observation.state / action, chosen by the keys, become the joint
    groups: a `names` dict splits a feature, a flat one is one group, a repeated group name gets its feature's
    prefix."""
    meta = _meta()  # observation.state and action exist too: the keys must override the defaults
    groups = {"arm": ["j0", "j1", "j2", "j3", "j4"], "hand": ["grip"]}
    meta.features.update(
        {
            "observation.joints": {"dtype": "float32", "shape": [6], "names": groups},
            "observation.velocity": {"dtype": "float32", "shape": [6], "names": groups},
            "observation.base": {"dtype": "float64", "shape": [3], "names": ["x", "y", "yaw"]},
            "action.joints": {"dtype": "float32", "shape": [6], "names": groups},
            "action.base": {"dtype": "float32", "shape": [2]},
        }
    )
    cfg = _cfg(
        state_keys=["observation.joints", "observation.velocity", "observation.base"],
        action_keys=["action.base", "action.joints"],
    )
    fmap = map_features(cfg, meta, tmp_path)
    shape = {
        kind: {name: (g["original_key"], g["start"], g["end"]) for name, g in fmap.modality[kind].items()}
        for kind in ("state", "action")
    }
    assert shape["state"] == {
        "arm": ("observation.joints", 0, 5),
        "hand": ("observation.joints", 5, 6),
        "observation.velocity.arm": ("observation.velocity", 0, 5),
        "observation.velocity.hand": ("observation.velocity", 5, 6),
        "observation.base": ("observation.base", 0, 3),
    }
    assert shape["action"] == {
        "action.base": ("action.base", 0, 2),
        "arm": ("action.joints", 0, 5),
        "hand": ("action.joints", 5, 6),
    }
    assert list(shape["action"]) == ["action.base", "arm", "hand"]  # the order of data.action_keys
    assert fmap.features("state") == ["observation.joints", "observation.velocity", "observation.base"]
    assert fmap.features("action") == ["action.base", "action.joints"]


def _data(root: Path):
    spec = SimpleNamespace(state_features=[("observation.state", 3)], action_features=[("action", 2)])
    return SimpleNamespace(root=root, spec=spec)


def test_non_finite_raw_values_name_episode_frame_feature_and_index(tmp_path) -> None:
    raw = {"episode_index": torch.tensor([4, 5]), "frame_index": torch.tensor([10, 20])}
    state, action = torch.zeros(2, 3), torch.zeros(2, 4, 2)
    check_finite(raw, state, action, _data(tmp_path))  # finite: nothing to say
    action[1, 2, 1] = float("inf")  # the chunk of frame 20, its third step: frame 22
    state[0, 2] = float("nan")
    with pytest.raises(DataError) as err:
        check_finite(raw, state, action, _data(tmp_path))
    message = str(err.value)
    assert "episode 4, frame 10: observation.state[2] is nan" in message
    assert "episode 5, frame 22: action[1] is inf" in message


def test_a_diverged_model_is_not_told_to_fix_its_frames() -> None:
    tags = [tag_samples({"action": torch.zeros(2, 3), "episode_index": torch.tensor([1, 2])})]
    where, checked = describe_nonfinite(tags)
    assert where is None and checked
    message = str(NonFiniteLossError(5, float("nan"), [1, 2], 0, where, inputs_finite=True))
    assert "Every input of that batch is finite: the model diverged; lower optim.lr" in message
    assert "Fix or drop" not in message and "Check those episodes" not in message


def test_bad_samples_are_named_with_the_fix() -> None:
    batch = {"action": torch.tensor([[0.0], [float("nan")]]), "episode_index": torch.tensor([1, 2])}
    where, checked = describe_nonfinite([tag_samples(batch)])
    message = str(NonFiniteLossError(5, float("nan"), [1, 2], 0, where))
    assert "Sample 1 of microbatch 0 (episode 2, frame unknown) has NaN/inf in action. Fix or drop" in message


def test_a_rank_with_a_finite_loss_points_to_the_rank_that_had_the_nan() -> None:
    message = str(NonFiniteLossError(3, float("nan"), None, 0, bad_ranks=[1]))
    assert "this rank's own loss was finite: the non-finite loss was on rank 1" in message
    assert "episode ids unknown" not in message


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float64])
def test_every_kind_of_non_finite_value_flags_its_sample_and_only_its_sample(dtype) -> None:
    """tag_samples takes one max-|value| reduction per sample: NaN (which a max propagates), +inf and -inf
    anywhere in a sample flag it; huge finite values and zeros do not."""
    values = torch.zeros(6, 3, 5, dtype=dtype)
    values[1, 2, 4] = float("nan")
    values[2, 0, 0] = float("inf")
    values[3, 1, 2] = -float("inf")
    values[4] = torch.finfo(dtype).max  # the largest finite values
    values[5, 0, 1], values[5, 2, 3] = float("nan"), float("inf")
    tags = tag_samples({"action": values})
    assert tags.nonfinite.tolist() == [[False, True, True, True, False, True]]
