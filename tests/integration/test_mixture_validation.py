"""Validation of a data.mixture run on CPU with the tiny model: two synthetic datasets (libero_panda, and gr1
with 12-d state, 10-d action, other statistics and a camera of another size), each holding one episode out.

Checked: every member is scored on its own held-out samples against its own mean-action baseline, exactly as
its own single-dataset run would score them with the same weights; the overall MSE and baseline are the
members' sample-weighted means; the records reach metrics.jsonl and summary.json; and the training losses are
the same bit for bit with and without validation."""

from __future__ import annotations

import json
import math

import gr00t_train
import pytest
from gr00t_train.cli import main
from gr00t_train.data.mixture import member_config
from gr00t_train.metrics.component import read_validation
from gr00t_train.model.build import build_parts
from gr00t_train.validation.component import ValidationComponent

ARM_GROUPS = {"eef_delta_pos", "eef_delta_rot", "gripper"}


@pytest.fixture(scope="module")
def roots(tmp_path_factory):
    import vla_io

    base = vla_io.testing.SynthConfig(episodes=3, episode_length=24, image_size=64, codec="h264")
    folder = tmp_path_factory.mktemp("mixture-val")
    humanoid = base.with_(state_dim=12, action_dim=10, camera_sizes=((64, 96), (64, 64)), seed=1)
    return {
        "arm": vla_io.write_synthetic_dataset(folder / "arm", base, progress=False),
        "humanoid": vla_io.write_synthetic_dataset(folder / "humanoid", humanoid, progress=False),
    }


def _config_file(tmp_path, roots):
    path = tmp_path / "mixture.toml"
    path.write_text(f"""preset = "demo"
device = "cpu"
steps = 4

[data]
cameras = "none"
embodiment_tag = "new_embodiment"
batch_size = 4
num_workers = 1
val_episodes = 1

[eval]
every = 2
batches = 2

[[data.mixture]]
dataset = "{roots["arm"]}"
embodiment_tag = "libero_panda"

[[data.mixture]]
dataset = "{roots["humanoid"]}"
embodiment_tag = "gr1"
cameras = ["wrist_image", "image"]
""")
    return path


class _Weights:
    """The Trainer's ModelComponent as validation uses it: the module, nothing pending."""

    def __init__(self, module) -> None:
        self.module = module

    def wait_for_update(self) -> None:
        pass


def _validate(cfg, env, state=None):
    parts = build_parts(cfg, env)
    try:
        if state is not None:
            parts.model.load_state_dict(state)
        return parts, ValidationComponent(cfg, env, parts, _Weights(parts.model)).run(step=0)
    finally:
        parts.data.close()


def test_each_member_scores_as_its_own_single_dataset_run(tmp_path, roots) -> None:
    overrides = [f"output_dir={tmp_path / 'run'}", "data.num_workers=0", "optimizations.data=sync"]
    cfg = gr00t_train.load_config(_config_file(tmp_path, roots), overrides=overrides)
    env = gr00t_train.init_distributed("cpu")
    try:
        parts, record = _validate(cfg, env)
        state = parts.model.state_dict()
        alone = [_validate(member_config(cfg, i), env, state)[1] for i in range(2)]
    finally:
        gr00t_train.shutdown_distributed(env)

    members = record["members"]
    assert list(members) == ["arm", "humanoid"] and record["groups"] == {}
    assert set(members["arm"]["groups"]) == ARM_GROUPS
    for name, single in zip(members, alone):
        scores = members[name]
        assert scores["samples"] == 8  # eval.batches=2 of 4 per member
        assert all(math.isfinite(scores[k]) and scores[k] > 0 for k in ("mse", "baseline", "ratio"))
        # the same samples, noise, statistics and kernels as the member's own run: the same numbers
        assert scores == {k: v for k, v in single.items() if k not in ("kind", "step", "seconds")}
    # each normalizes with its own statistics: the members' baselines differ
    assert members["arm"]["baseline"] != members["humanoid"]["baseline"]
    weights = [members[n]["samples"] for n in members]
    for key in ("mse", "baseline"):
        mean = sum(w * members[n][key] for w, n in zip(weights, members)) / sum(weights)
        assert record[key] == pytest.approx(mean, rel=1e-12)
    assert record["ratio"] == pytest.approx(record["mse"] / record["baseline"], rel=1e-12)
    assert record["samples"] == sum(weights)


@pytest.mark.slow
def test_a_validated_mixture_run_trains_bit_for_bit_and_records_every_member(tmp_path, roots, losses) -> None:
    config = _config_file(tmp_path, roots)
    sets = ["logging.every=1", "logging.progress=false", "logging.plots=false", "logging.tensorboard=false"]

    def train(out, *more):
        args = ["train", "--config", str(config)]
        for item in [f"output_dir={out}", *sets, *more]:
            args += ["--set", item]
        assert main(args) == 0

    plain, run = tmp_path / "plain", tmp_path / "run"
    train(plain, "eval.every=0")
    train(run)
    # bit for bit: validation draws, reads and changes nothing of training
    assert losses(run) == losses(plain)

    validations = read_validation(run / "metrics.jsonl")
    assert [v["step"] for v in validations] == [2, 4]
    for v in validations:
        assert set(v["members"]) == {"arm", "humanoid"} and v["samples"] == 16
        for scores in v["members"].values():
            assert all(math.isfinite(scores[k]) and scores[k] > 0 for k in ("mse", "baseline", "ratio"))
    summary = json.loads((run / "summary.json").read_text())
    assert summary["validation"]["members"] == validations[-1]["members"]
    assert set(summary["validation_split"]) == {"arm", "humanoid"}
