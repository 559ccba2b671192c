"""`gr00t-train` on plain LeRobot datasets written by `vla-io synth`: no modality.json, no statistics, two
cameras of different sizes and aspect ratios, made read-only. Training needs only data.dataset and
data.cameras; nothing is written into the dataset; infer works from the checkpoint; a dataset whose features
cannot be mapped stops with exit code 2 before the model is built."""

from __future__ import annotations

import json
import re
import shutil
import textwrap
from pathlib import Path

import pytest
from _readonly import read_only
from gr00t_train.cli import main
from vla_io.cli import main as vla_io_main

CAMERAS = "front=48x96,wrist=64x64"  # 1:2 and square


@pytest.fixture(scope="module")
def plain(tmp_path_factory):
    """v3.0 and v2.0 (flat `names`) and v2.1 (`names` as a dict of joint groups) datasets, written by the
    CLI; v2.0 has no per-episode statistics."""
    made = {}
    for version, extra in (("v3.0", []), ("v2.1", ["--grouped-names"]), ("v2.0", [])):
        root = tmp_path_factory.mktemp(f"plain-{version}") / "ds"
        args = ["synth", str(root), "--preset", "tiny", "--version", version, "--codec", "h264",
                "--cameras", CAMERAS, "--no-modality", "--no-stats", *extra]  # fmt: skip
        assert vla_io_main(args) == 0
        made[version] = root
    return made


def _args(root, out, *sets):
    base = [f"data.dataset={root}", "data.cameras=front,wrist", f"output_dir={out}", "device=cpu", "steps=3",
            "data.batch_size=4", "data.num_workers=1", "logging.every=1", "logging.progress=false",
            "logging.plots=false", "model.preset=tiny", "checkpoint.every=3"]  # fmt: skip
    argv = ["train"]
    for item in [*base, *sets]:
        argv += ["--set", item]
    return argv


@pytest.mark.slow
@pytest.mark.parametrize("version", ["v3.0", "v2.1", "v2.0"])
def test_plain_read_only_dataset_trains_with_dataset_and_cameras_only(plain, version, tmp_path, losses):
    root = plain[version]
    out = tmp_path / "run"
    with read_only(root):
        assert main(_args(root, out, "data.augment=true")) == 0
        checkpoint = out / "checkpoints" / "step_000003"
        report = tmp_path / "eval.json"
        argv = ["infer", "--checkpoint", str(checkpoint), "--dataset", str(root), "--batches", "1"]
        assert main([*argv, "--batch-size", "4", "--json", str(report)]) == 0
    assert sorted(losses(out)) == [1, 2, 3] and all(0 < v < 10 for v in losses(out).values())
    modality = json.loads((checkpoint / "dataset_meta" / "modality.json").read_text())
    stats = json.loads((checkpoint / "dataset_meta" / "stats.json").read_text())
    if version == "v2.1":  # `names` given as a dict of lists: one joint group each
        assert list(modality["state"]) == ["eef_pos", "eef_axis_angle", "gripper"]
        assert list(modality["action"]) == ["eef_delta_pos", "eef_delta_rot", "gripper"]
    else:  # flat `names`: the whole feature is one group
        assert modality["state"] == {
            "observation.state": {"start": 0, "end": 8, "original_key": "observation.state"}
        }
        assert modality["action"] == {"action": {"start": 0, "end": 7, "original_key": "action"}}
    assert set(stats) == {"observation.state", "action"} and len(stats["action"]["q99"]) == 7  # computed
    assert set(json.loads(report.read_text())["mse"]) == set(modality["action"])


@pytest.mark.slow
def test_groups_from_the_readme_modality_file_outside_the_dataset(plain, tmp_path, losses):
    """The modality.json example of the gr00t-train README, given with data.modality_file to a read-only
    dataset: its groups, and its short camera names in data.cameras."""
    readme = (Path(__file__).resolve().parents[2] / "packages" / "gr00t-train" / "README.md").read_text()
    (example,) = re.findall(r"```json\n(.*?)```", readme, re.S)
    path = tmp_path / "modality.json"
    path.write_text(textwrap.dedent(example))
    root, out = plain["v3.0"], tmp_path / "run"
    with read_only(root):
        assert (
            main(_args(root, out, f"data.modality_file={path}", "steps=2", "data.cameras=wrist,front")) == 0
        )
    saved = json.loads((out / "checkpoints" / "step_000002" / "dataset_meta" / "modality.json").read_text())
    assert list(saved["state"]) == ["eef_pos", "eef_axis_angle", "gripper"]
    assert list(saved["action"]) == ["eef_delta_pos", "eef_delta_rot", "gripper"]
    assert saved["state"]["gripper"] == {"start": 6, "end": 8, "original_key": "observation.state"}


def _no_model(*args, **kwargs):
    raise AssertionError("the model was built before the dataset was checked")


def test_unmappable_dataset_exits_2_before_the_model_is_built(plain, tmp_path, capsys, monkeypatch):

    monkeypatch.setattr("gr00t_train.model.gr00t.build_model", _no_model)
    root = tmp_path / "renamed"
    shutil.copytree(plain["v3.0"], root)
    info = json.loads((root / "meta" / "info.json").read_text())
    info["features"]["observation.joints"] = info["features"].pop("observation.state")
    (root / "meta" / "info.json").write_text(json.dumps(info))
    with read_only(root):
        assert main(_args(root, tmp_path / "run")) == 2
    err = capsys.readouterr().err
    assert "has no 'observation.state' feature to use as the state and no modality.json" in err
    assert "observation.joints (float32[8])" in err and "action (float32[7])" in err
    assert "observation.images.front (video[48, 96, 3])" in err
    assert "--set data.state_keys=" in err and "--set data.modality_file=" in err
    # naming a feature that does not exist, or one that is not a numeric vector, is the same kind of error
    for bad in ("observation.velocity", "observation.images.front"):
        assert main(_args(plain["v3.0"], tmp_path / "run", f"data.state_keys={bad}")) == 2
        err = capsys.readouterr().err
        assert (
            f"data.state_keys: '{bad}' is not a numeric vector feature" in err
            and "action (float32[7])" in err
        )


@pytest.mark.gpu
@pytest.mark.parametrize("backend", ["torch", "dali"])
def test_mixed_cameras_augmented_on_the_gpu(plain, tmp_path, losses, backend):
    if backend == "dali":
        pytest.importorskip("nvidia.dali")
    root = plain["v3.0"]
    out = tmp_path / "run"
    sets = ("device=cuda", "data.augment=true", f"data.augment_backend={backend}", "steps=4")
    with read_only(root):
        assert main(_args(root, out, *sets)) == 0
    values = losses(out)
    assert sorted(values) == [1, 2, 3, 4] and all(0 < v < 10 for v in values.values())
