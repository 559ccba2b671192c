"""Batched image transforms: torch and DALI backends agree; parameters are per-sample and reproducible."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from vla_io import ImageAugment, ImageTransformConfig, LeRobotDataset
from vla_io.augment import sample_params
from vla_io.augment.torch_backend import resample_weights, resize_uint8

# DALI vs torch, measured on real frames: max |difference| 0.0075 on the 0..255 scale before normalization
TOLERANCE_255 = 0.02
CONFIGS = {
    "resize": ImageTransformConfig(size=(48, 40)),
    "upscale": ImageTransformConfig(size=(96, 80), mean=(0.5, 0.5, 0.5), std=(0.5, 0.5, 0.5)),
    "crop": ImageTransformConfig(size=(32, 32), crop_scale=(0.4, 0.9), crop_ratio=(0.75, 1.33)),
    "jitter": ImageTransformConfig(
        size=(56, 56),
        crop_scale=(0.6, 1.0),
        brightness=0.3,
        contrast=0.4,
        saturation=0.5,
        hue=25,
        mean=(0.48, 0.45, 0.4),
        std=(0.27, 0.26, 0.28),
    ),  # fmt: skip
}


@pytest.fixture(scope="module")
def frames(synth_root, gr1_root):
    synth = LeRobotDataset(synth_root("v2.1", "av1"), image_dtype="uint8", progress=False).get_batch(
        range(0, 40, 5)
    )
    real = LeRobotDataset(gr1_root, image_dtype="uint8", progress=False).get_batch([0, 900])
    small = (
        torch.nn.functional.interpolate(real["observation.images.ego_view"].float(), size=(64, 64))
        .round()
        .byte()
    )
    return torch.cat([synth["observation.images.image"], small])


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_dali_matches_torch(frames, name):
    pytest.importorskip("nvidia.dali")
    cfg = CONFIGS[name]
    params = sample_params(cfg, len(frames), 1, 64, 64, seeds=np.arange(len(frames)) + 7)
    torch_out = ImageAugment(cfg, backend="torch").run(frames, params)
    dali_out = ImageAugment(cfg, backend="dali").run(frames, params)
    assert torch_out.shape == dali_out.shape == (len(frames), 3, *cfg.size)
    diff = (torch_out - dali_out).abs() * torch.tensor(cfg.std).view(1, 3, 1, 1) * 255
    assert diff.max().item() < TOLERANCE_255


def test_dali_pipeline_reused_at_smaller_batches(frames):
    """One DALI pipeline serves batches up to its capacity; the feeding path is the GPU's (stream None)."""
    pytest.importorskip("nvidia.dali")
    cfg = CONFIGS["jitter"]
    augment = ImageAugment(cfg, backend="dali")
    for n in (len(frames), 3, 1):
        params = sample_params(cfg, n, 1, 64, 64, seeds=np.arange(n) + 3)
        diff = (augment.run(frames[:n], params) - ImageAugment(cfg).run(frames[:n], params)).abs()
        assert (diff * torch.tensor(cfg.std).view(1, 3, 1, 1) * 255).max().item() < TOLERANCE_255
    assert len(augment._dali["cpu"]._pipes) == 1


def test_identity_is_exact(frames):
    out = ImageAugment(ImageTransformConfig(size=(64, 64))).apply(frames)
    assert torch.equal(out, frames.float() / 255)


def test_resize_weights_are_normalized_and_resize_uint8_keeps_constants():
    w = resample_weights(torch.tensor([0.0, 3.5]), torch.tensor([64.0, 40.0]), 24, 64)
    torch.testing.assert_close(w.sum(-1), torch.ones(2, 24, dtype=w.dtype))
    flat = torch.full((2, 3, 64, 64), 77, dtype=torch.uint8)
    assert torch.equal(resize_uint8(flat, (20, 30)), torch.full((2, 3, 20, 30), 77, dtype=torch.uint8))


def test_seeded_params_are_reproducible_and_per_sample():
    cfg = CONFIGS["jitter"]
    a = sample_params(cfg, 3, 2, 64, 64, seeds=[10, 11, 12])
    b = sample_params(cfg, 2, 2, 64, 64, seeds=[11, 12])  # same samples in another batch
    np.testing.assert_array_equal(a.brightness[2:], b.brightness)
    assert a.brightness[0] != a.brightness[1]  # views differ unless asked otherwise
    same = sample_params(
        ImageTransformConfig(**{**cfg.__dict__, "same_across_views": True}), 3, 2, 64, 64, seeds=[10, 11, 12]
    )
    np.testing.assert_array_equal(same.brightness[0::2], same.brightness[1::2])
    np.testing.assert_array_equal(same.y0[0::2], same.y0[1::2])


def test_seeded_params_are_uniform_and_independent():
    cfg = CONFIGS["jitter"]
    p = sample_params(cfg, 4000, 2, 64, 64, seeds=np.arange(4000) * 7919)
    b = p.brightness.reshape(4000, 2)
    assert b.min() >= 0.7 and b.max() <= 1.3
    counts = np.histogram(b[:, 0], bins=10, range=(0.7, 1.3))[0]
    assert counts.min() > 0.8 * 400 and counts.max() < 1.2 * 400  # flat
    for x, y in [(b[:, 0], b[:, 1]), (p.brightness, p.contrast), (p.saturation, p.hue)]:
        assert abs(np.corrcoef(x, y)[0, 1]) < 0.05  # views and parameters draw independently
    area = (p.y1 - p.y0) * (p.x1 - p.x0) / (64 * 64)
    assert area.min() >= 0.6 - 1e-9 and area.max() <= 1.0 and (p.y0 >= 0).all() and (p.x1 <= 64).all()


def test_dict_interface_stacks_views_with_shared_params(frames):
    cfg = ImageTransformConfig(size=(32, 32), crop_scale=(0.5, 1), brightness=0.3, same_across_views=True)
    batch = {
        "cam_a": frames[:4],
        "cam_b": frames[:4].clone(),
        "state": torch.zeros(4, 2),
        "sample_seed": torch.arange(4),
    }
    out = ImageAugment(cfg, ["cam_a", "cam_b"], stack_as="images")(batch)
    assert (
        "cam_a" not in out
        and out["images"].shape == (4, 2, 3, 32, 32)
        and torch.equal(out["state"], batch["state"])
    )
    torch.testing.assert_close(out["images"][:, 0], out["images"][:, 1])  # same frames, same params
    again = ImageAugment(cfg, ["cam_a", "cam_b"], stack_as="images")(batch)
    assert torch.equal(out["images"], again["images"])
    per_key = ImageAugment(cfg, ["cam_a"])({"cam_a": frames[:4], "sample_seed": torch.arange(4)})
    assert per_key["cam_a"].shape == (4, 3, 32, 32)


def test_time_axis_counts_as_views(frames):
    cfg = ImageTransformConfig(size=(16, 16), brightness=0.5)
    clip = torch.stack([frames[:3], frames[3:6]], dim=1)  # (B, T, C, H, W)
    out = ImageAugment(cfg, ["clip"])({"clip": clip, "sample_seed": torch.tensor([1, 2, 3])})
    assert out["clip"].shape == (3, 2, 3, 16, 16)


def test_errors_name_the_problem(frames):
    with pytest.raises(ValueError, match="crop_scale"):
        ImageTransformConfig(size=(8, 8), crop_scale=(0.0, 1.0))
    with pytest.raises(ValueError, match="output_dtype"):
        ImageTransformConfig(size=(8, 8), output_dtype="int8")
    with pytest.raises(ValueError, match="backend"):
        ImageAugment(ImageTransformConfig(size=(8, 8)), backend="opencv")
    with pytest.raises(KeyError, match="cam_x"):
        ImageAugment(ImageTransformConfig(size=(8, 8)), ["cam_x"])({"cam_a": frames})
    with pytest.raises(TypeError, match="uint8"):
        ImageAugment(ImageTransformConfig(size=(8, 8)), ["cam_a"])({"cam_a": frames.float()})


def test_bfloat16_output(frames):
    out = ImageAugment(ImageTransformConfig(size=(16, 16), output_dtype="bfloat16")).apply(frames[:2])
    assert out.dtype == torch.bfloat16


@pytest.mark.gpu
@pytest.mark.parametrize("backend", ["torch", "dali"])
def test_gpu_matches_cpu(frames, backend):
    if backend == "dali":
        pytest.importorskip("nvidia.dali")
    cfg = CONFIGS["jitter"]
    params = sample_params(cfg, len(frames), 1, 64, 64, seeds=np.arange(len(frames)))
    cpu = ImageAugment(cfg, backend="torch").run(frames, params)
    gpu = ImageAugment(cfg, backend=backend).run(frames.cuda(), params)
    assert gpu.device.type == "cuda"
    diff = (gpu.cpu() - cpu).abs() * torch.tensor(cfg.std).view(1, 3, 1, 1) * 255
    assert diff.max().item() < 0.1  # float32 on both devices; a trainer that enables TF32 sees up to ~0.3


@pytest.mark.gpu
@pytest.mark.parametrize("backend", ["torch", "dali"])
def test_gpu_augment_never_blocks_the_host(frames, backend):
    """With seeds on the host (as the pipeline delivers them), nothing waits for the device: parameters go
    up through pinned memory, nothing is read back."""
    if backend == "dali":
        pytest.importorskip("nvidia.dali")
    augment = ImageAugment(CONFIGS["jitter"], ["cam"], backend=backend)
    batch = {"cam": frames.cuda(), "sample_seed": torch.arange(len(frames))}
    expected = augment(batch)["cam"]  # warm-up: allocations, DALI pipeline build
    torch.cuda.set_sync_debug_mode("error")
    try:
        out = augment(batch)["cam"]
    finally:
        torch.cuda.set_sync_debug_mode("default")
    assert torch.equal(out, expected)
