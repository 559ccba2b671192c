"""Plain-torch image preparation: crop, resize to the model's size, optional color jitter, normalize.

A training pipeline normally does this on the GPU in its data library, from uint8 frames, using the numbers in
`ImageSpec`; this module is the simple path (and the reference that such a path can be tested against).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

_GRAY = (0.299, 0.587, 0.114)


@dataclass(frozen=True)
class ImageSpec:
    """What the model expects of an image: (height, width), normalization, and the crop the release uses."""

    size: tuple[int, int]
    """Target (height, width), multiples of patch * downsample (28 for the release)."""
    mean: float = 0.5
    """pixel = (value / 255 - mean) / std."""
    std: float = 0.5
    crop_fraction: float = 0.95
    """Side fraction kept by the crop (center crop at inference, random crop in training)."""


def to_channels_first(images: torch.Tensor) -> torch.Tensor:
    """[..., H, W, 3] or [..., 3, H, W] -> [..., 3, H, W] (channel-last is recognised by a last dim of 3)."""
    if images.shape[-1] == 3 and images.shape[-3] != 3:
        return images.movedim(-1, -3)
    if images.shape[-3] != 3:
        raise ValueError(f"images must be [..., 3, H, W] or [..., H, W, 3], got {tuple(images.shape)}")
    return images


def preprocess_images(
    images: torch.Tensor,
    spec: ImageSpec,
    *,
    train: bool = False,
    brightness: float = 0.0,
    contrast: float = 0.0,
    saturation: float = 0.0,
    generator: torch.Generator | None = None,
) -> torch.Tensor:
    """uint8 frames [B, V, 3, H, W] (or channel-last) -> normalized float32 [B, V, 3, h, w] at spec.size.

    Runs on the frames' device (CPU in a pipeline thread, or a GPU); random draws come from a CPU generator.

    Inference: center crop of spec.crop_fraction, then bilinear antialiased resize. train=True: a random crop
    and random brightness/contrast/saturation factors in [1 - a, 1 + a], the same for every view of a sample.
    """
    images = to_channels_first(torch.as_tensor(images))
    if images.ndim == 4:
        images = images[:, None]
    if images.ndim != 5:
        raise ValueError(f"images must be [B, V, 3, H, W], got {tuple(images.shape)}")
    batch, views, _, height, width = images.shape
    crop_h, crop_w = max(1, round(height * spec.crop_fraction)), max(1, round(width * spec.crop_fraction))
    if train:
        tops = torch.randint(0, height - crop_h + 1, (batch,), generator=generator).tolist()
        lefts = torch.randint(0, width - crop_w + 1, (batch,), generator=generator).tolist()
    else:
        tops, lefts = [(height - crop_h) // 2] * batch, [(width - crop_w) // 2] * batch
    out = torch.empty(batch, views, 3, *spec.size, dtype=torch.float32, device=images.device)
    for i in range(batch):
        crop = images[i, :, :, tops[i] : tops[i] + crop_h, lefts[i] : lefts[i] + crop_w].to(torch.float32)
        resized = F.interpolate(crop, size=spec.size, mode="bilinear", align_corners=False, antialias=True)
        out[i] = resized.clamp(0.0, 255.0) / 255.0
    if train and (brightness or contrast or saturation):
        out = color_jitter(out, brightness, contrast, saturation, generator)
    return (out - spec.mean) / spec.std


def color_jitter(
    images: torch.Tensor,
    brightness: float,
    contrast: float,
    saturation: float,
    generator: torch.Generator | None = None,
) -> torch.Tensor:
    """Per-sample random brightness, contrast and saturation on [B, V, 3, H, W] in [0, 1]."""
    batch = images.shape[0]

    def factor(amount: float) -> torch.Tensor:
        u = torch.rand(batch, generator=generator) * 2 - 1  # CPU draws: reproducible on any device
        return (1 + amount * u).view(batch, 1, 1, 1, 1).to(images.device)

    weights = torch.tensor(_GRAY, device=images.device).view(1, 1, 3, 1, 1)
    images = (images * factor(brightness)).clamp(0, 1)
    gray_mean = (images * weights).sum(2, keepdim=True).mean((-1, -2), keepdim=True)
    images = ((images - gray_mean) * factor(contrast) + gray_mean).clamp(0, 1)
    gray = (images * weights).sum(2, keepdim=True)
    return ((images - gray) * factor(saturation) + gray).clamp(0, 1)
