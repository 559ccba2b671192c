"""The ablation ladder's LeRobot-style baseline (`optimizations.data=dataloader`: a torch DataLoader with
workers over single samples) prepares images with the very transform vla-io's pipeline runs
(`data.dataset.image_transform`), on the CPU in its workers: with augmentation off both feed the model the same
pixels; with it on, the draws are a function of the run's seed, the epoch and the sample, so a resumed
baseline continues as the uninterrupted one."""

from __future__ import annotations

from types import SimpleNamespace

import gr00t_model
import gr00t_train
import pytest
import torch
from gr00t_train._baselines import LeRobotStyleSource
from gr00t_train.data import dataset as _data

BATCH = 4


def _opened(dataset, augment: bool, seed: int = 42):
    cfg = gr00t_train.load_config(
        preset="demo",
        overrides=[f"data.dataset={dataset}", f"seed={seed}", f"data.augment={str(augment).lower()}",
                   f"data.batch_size={BATCH}", "data.num_workers=1", "data.shuffle=false"],
    )  # fmt: skip
    data = _data.open_dataset(cfg, model_horizon=16, progress=False)
    processor = _data.make_processor(data, gr00t_model.GR00TConfig.preset("tiny"), None, vlm_seq_len=None)
    return cfg, data, processor


def _baseline(dataset, augment: bool, seed: int = 42) -> LeRobotStyleSource:
    cfg, data, processor = _opened(dataset, augment, seed)
    env = SimpleNamespace(rank=0, world_size=1, device=torch.device("cpu"))
    return LeRobotStyleSource(cfg, data, processor, env)


def test_without_augmentation_the_baseline_feeds_what_the_pipeline_feeds(dataset) -> None:
    import vla_io

    _cfg, data, processor = _opened(dataset, augment=False)
    images = _data.image_transform(processor, len(data.camera_keys), augment=False, backend="torch")
    with vla_io.Pipeline(data.dataset, BATCH, transform=_data.host_transform(data, processor),
                         device_transform=images, shuffle=False, synchronous=True, device="cpu") as pipe:  # fmt: skip
        expected = next(iter(pipe))
    source = _baseline(dataset, augment=False)
    try:
        batch = next(source)
    finally:
        source.close()
    assert torch.equal(batch["episode_index"], expected["episode_index"])
    assert torch.equal(batch["frame_index"], expected["frame_index"])
    # the same decoded frames through the same kernels: bit for bit
    assert batch["pixel_values"].shape == expected["pixel_values"].shape
    assert torch.equal(batch["pixel_values"], expected["pixel_values"])


@pytest.mark.parametrize("steps_before", [1, 2])
def test_augmented_baseline_is_seeded_and_resumes_exactly(dataset, steps_before: int) -> None:
    first = _baseline(dataset, augment=True)
    try:
        batches = [next(first)["pixel_values"] for _ in range(3)]
        plain = _baseline(dataset, augment=False)
        assert not torch.equal(batches[0], next(plain)["pixel_values"])  # crops and jitter were applied
        plain.close()
        assert not torch.equal(batches[0], batches[1])
    finally:
        first.close()
    resumed = _baseline(dataset, augment=True)
    again = _baseline(dataset, augment=True)
    other_seed = _baseline(dataset, augment=True, seed=7)
    try:
        for _ in range(steps_before):
            next(again)
        resumed.load_state_dict(again.state_dict())
        assert torch.equal(next(resumed)["pixel_values"], batches[steps_before])
        assert not torch.equal(next(other_seed)["pixel_values"], batches[0])  # cfg.seed reaches the draws
    finally:
        for source in (resumed, again, other_seed):
            source.close()
