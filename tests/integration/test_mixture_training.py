"""Training on a data.mixture: three synthetic datasets of two embodiments (libero_panda twice, with other
statistics, and gr1 with 12-d state, 10-d action and a camera of another size), on CPU with the tiny model.

Checked: each sample is normalized with its own dataset's statistics and carries its embodiment's slot;
the device image step of a batch whose cameras differ in size equals the plain transform of each dataset's
samples alone; a batch mixes embodiments and the loss reaches each one's projector slot (and no other);
a run resumed from a checkpoint repeats the uninterrupted run's losses bit for bit, and a changed member
is refused."""

from __future__ import annotations

import json
import shutil

import gr00t_model
import gr00t_train
import numpy as np
import pytest
import torch
from gr00t_train.cli import main
from gr00t_train.data import dataset as _data
from gr00t_train.data import mixture_data as _mixture_data
from gr00t_train.model import gr00t as _gr00t

SLOTS = {
    "libero_panda": gr00t_model.EMBODIMENT_TAGS["libero_panda"],
    "gr1": gr00t_model.EMBODIMENT_TAGS["gr1"],
}


@pytest.fixture(scope="module")
def roots(tmp_path_factory):
    import vla_io

    base = vla_io.testing.SynthConfig(episodes=3, episode_length=24, image_size=64, codec="h264")
    folder = tmp_path_factory.mktemp("mixture")
    humanoid = base.with_(state_dim=12, action_dim=10, camera_sizes=((64, 96), (64, 64)), seed=1)
    return {
        "arm": vla_io.write_synthetic_dataset(folder / "arm", base, progress=False),
        "humanoid": vla_io.write_synthetic_dataset(folder / "humanoid", humanoid, progress=False),
        "arm2": vla_io.write_synthetic_dataset(
            folder / "arm2", base.with_(version="v3.0", seed=2, episodes=4, episode_length=20), progress=False
        ),
    }


def _config_file(tmp_path, roots, arm2=None):
    text = f"""preset = "demo"
device = "cpu"
steps = 6

[data]
cameras = "none"
embodiment_tag = "new_embodiment"
batch_size = 4
num_workers = 1
augment = true

[[data.mixture]]
dataset = "{roots["arm"]}"
weight = 2.0
embodiment_tag = "libero_panda"

[[data.mixture]]
dataset = "{roots["humanoid"]}"
weight = 1.0
embodiment_tag = "gr1"
cameras = ["wrist_image", "image"]

[[data.mixture]]
dataset = "{arm2 or roots["arm2"]}"
weight = 1.0
embodiment_tag = "libero_panda"
"""
    path = tmp_path / "mixture.toml"
    path.write_text(text)
    return path


def _opened(tmp_path, roots):
    cfg = gr00t_train.load_config(_config_file(tmp_path, roots))
    model_config = gr00t_model.GR00TConfig.preset("tiny")
    tokenizer = gr00t_model.load_tokenizer(None)
    plans = _mixture_data.plan_mixture(cfg)
    mix = _mixture_data.open_mixture(plans, model_horizon=model_config.action_horizon, progress=False)
    processors = _mixture_data.attach_processors(mix, model_config, tokenizer, None)
    return cfg, mix, processors


def test_each_sample_is_normalized_with_its_own_datasets_statistics(tmp_path, roots) -> None:
    _, mix, _ = _opened(tmp_path, roots)
    offsets = mix.dataset.offsets
    picks = [int(offsets[1]) + 5, 3, int(offsets[2]) + 7, int(offsets[1]) + 1, int(offsets[2])]
    batch = mix.dataset.get_batch(picks)
    member, local = mix.dataset.locate(picks)
    assert batch["embodiment_id"].tolist() == [SLOTS[mix.entries[m].embodiment_tag] for m in member]
    for row, (m, i) in enumerate(zip(member.tolist(), local.tolist())):
        data = mix.members[m]
        raw = data.dataset.get_batch([i])
        expected = data.spec.normalize_state(data.raw_state(raw))[0]
        width = data.spec.state_dim
        assert torch.equal(batch["state"][row, 0, :width], expected)
        assert not batch["state"][row, 0, width:].any()  # padded to the model's max state dim
        action = data.spec.normalize_action(data.raw_action(raw), data.raw_state(raw))[0]
        assert torch.equal(batch["action"][row, : data.horizon, : data.spec.action_dim], action)
    # the two libero_panda datasets share a projector slot but not their statistics
    arm, arm2 = mix.members[0], mix.members[2]
    raw = arm2.dataset.get_batch([0])
    own = arm2.spec.normalize_state(arm2.raw_state(raw))
    assert not torch.allclose(own, arm.spec.normalize_state(arm.raw_state(raw)))


def test_images_of_other_sizes_match_each_datasets_own_transform(tmp_path, roots) -> None:
    cfg, mix, processors = _opened(tmp_path, roots)
    assert mix.frame_sizes[1] == [(64, 64), (64, 96)] and mix.canvases == [(64, 64), (64, 96)]
    assert not mix.uniform_frames
    augment = _data.image_transform(processors[0], 2, augment=True, backend="torch")
    offsets = mix.dataset.offsets
    picks = [0, int(offsets[1]) + 2, 9, int(offsets[2]) + 4, int(offsets[1]) + 30, 17]
    batch = mix.dataset.get_batch(picks)
    batch["sample_seed"] = torch.arange(100, 100 + len(picks), dtype=torch.int64)
    images = _mixture_data.MixtureImages(augment, mix)(_mixture_data.host_rows(batch))["pixel_values"]
    member, local = mix.dataset.locate(picks)
    for m, data in enumerate(mix.members):
        rows = np.flatnonzero(member == m)
        alone = _data.host_transform(data, processors[m])(data.dataset.get_batch(local[rows]))
        alone["sample_seed"] = batch["sample_seed"][rows]
        assert torch.equal(images[rows], augment(alone)["pixel_values"])  # same sizes, same kernels


def test_mixed_batches_train_every_embodiments_projector_slot(tmp_path, roots) -> None:
    cfg = gr00t_train.load_config(
        _config_file(tmp_path, roots),
        overrides=[f"output_dir={tmp_path / 'run'}", "optimizations.comm=ddp", "data.num_workers=0"],
    )
    env = gr00t_train.init_distributed("cpu")
    try:
        parts = _build(cfg, env)
        for _ in range(20):  # weights 3:1 between the embodiments: most batches of 4 hold both
            batch = next(parts.data)
            if len(set(batch["embodiment_id"].tolist())) == 2:
                break
        parts.data.close()
    finally:
        gr00t_train.shutdown_distributed(env)
    assert set(batch["embodiment_id"].tolist()) == set(SLOTS.values())
    model = parts.model
    model.zero_grad(set_to_none=True)
    _gr00t.gr00t_loss(model, {**batch, **parts.draw(batch)}).backward()
    tables = _gr00t.embodiment_tables(model)
    assert tables
    for table in tables:  # [slots, ...]: the rows of the batch's embodiments get gradients, no other row
        touched = {s for s in range(table.shape[0]) if table.grad[s].abs().sum() > 0}
        assert touched == set(SLOTS.values()), (tuple(table.shape), touched)


def _build(cfg, env):
    from gr00t_train.model.build import build_parts

    return build_parts(cfg, env)


def _losses(run) -> list[float]:
    return [
        json.loads(line)["loss"]
        for line in (run / "metrics.jsonl").read_text().splitlines()
        if '"kind"' not in line
    ]


@pytest.mark.slow
def test_a_mixture_run_resumes_bit_for_bit_and_refuses_a_changed_member(tmp_path, roots, capsys) -> None:
    arm2 = tmp_path / "arm2"
    shutil.copytree(roots["arm2"], arm2)
    config = _config_file(tmp_path, roots, arm2=arm2)
    out = tmp_path / "run"
    args = ["train", "--config", str(config)]
    for item in [f"output_dir={out}", "checkpoint.every=3", "logging.every=1", "logging.progress=false",
                 "logging.plots=false", "logging.tensorboard=false"]:  # fmt: skip
        args += ["--set", item]
    assert main(args) == 0
    reference = _losses(out)
    step3 = out / "checkpoints" / "step_000003"
    meta = step3 / "dataset_meta"
    listing = json.loads((meta / "mixture.json").read_text())
    assert [m["folder"] for m in listing] == ["0-arm", "1-humanoid", "2-arm2"]
    stats = [json.loads((meta / m["folder"] / "stats.json").read_text()) for m in listing]
    assert len(stats[1]["observation.state"]["mean"]) == 12 and stats[0] != stats[2]
    state = torch.load(step3 / "rank00000.pt", weights_only=True)["data"]
    assert state["sampler"]["weights"] == [0.5, 0.25, 0.25]

    assert main([*args, "--resume", str(step3)]) == 0
    assert _losses(out) == reference  # bit for bit
    # infer on one member normalizes with that member's statistics (dataset_meta/1-humanoid/)
    infer = ["infer", "--checkpoint", str(out / "checkpoints"), "--batches", "1", "--batch-size", "2"]
    assert main([*infer, "--dataset", str(roots["humanoid"])]) == 0
    assert main([*infer, "--dataset", str(tmp_path)]) == 2  # none of the members

    stats_file = arm2 / "meta" / "stats.json"
    stats_file.write_text(stats_file.read_text().replace("1", "2", 1))
    capsys.readouterr()
    assert main([*args, "--resume", str(step3)]) == 2  # refused before the model is built
    said = capsys.readouterr()
    assert "data.mixture: the datasets are not those" in said.err + said.out
    assert "2-arm2/meta/stats.json" in said.err + said.out


@pytest.mark.gpu
def test_a_mixture_trains_on_the_gpu_through_the_grouped_gemms(tmp_path, roots) -> None:
    """The default fast path on CUDA (grouped embodiment GEMMs, graphs, the device image step per dataset for
    cameras of other sizes): losses finite, and of the projector tables only the two embodiments' rows move
    (weight decay 0 in the demo preset: an untouched row stays as it was, bit for bit)."""
    from gr00t_train.model.build import build_parts

    cfg = gr00t_train.load_config(
        _config_file(tmp_path, roots),
        overrides=[
            f"output_dir={tmp_path / 'gpu'}",
            "device=cuda",
            "steps=8",
            "logging.progress=false",
            "logging.plots=false",
            "optimizations.grouped_embodiment_gemms=on",
        ],  # fmt: skip
    )
    env = gr00t_train.init_distributed("cuda")
    try:
        parts = build_parts(cfg, env)
        before = [t.detach().clone() for t in _gr00t.embodiment_tables(parts.model)]
        trainer = gr00t_train.Trainer(cfg, parts, env)
        summary = trainer.fit()
        after = [t.detach().clone() for t in _gr00t.embodiment_tables(parts.model)]
    finally:
        gr00t_train.shutdown_distributed(env)
    assert parts.model.config.grouped_embodiment_gemms
    assert summary.final_loss == summary.final_loss and summary.final_loss < 100  # finite
    for old, new in zip(before, after):
        moved = {s for s in range(old.shape[0]) if not torch.equal(old[s], new[s])}
        assert moved == set(SLOTS.values()), (tuple(old.shape), moved)
