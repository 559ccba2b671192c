"""Plain-torch image preparation for inference, per camera: letterbox, center crop, resize to the model's
size, normalize.

As the release (Isaac-GR00T N1.6 after its fix for cameras of different sizes): each camera's frame is padded
with black bars to a square (the model's aspect ratio), a fraction of each side is cropped around the centre,
then it is resized to the model's image size. The release resizes the shorter side to 256 around its crop and
rounds to a multiple of 28; this path resizes once, to the same final size.

Training augmentation (the random crop and color jitter the release trains with) is not done here: its ranges
are facts of the release, recorded in `ImageSpec`, and a training data library applies them (this project's
trainer hands them to vla-io, on uint8 frames on the GPU). This module is also the reference such a path's
center crop can be tested against.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F


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
    letterbox: bool = True
    """Pad each frame with black bars (centred) to the aspect ratio of `size` before cropping, so cameras
    of any shape are not stretched (the release pads to a square)."""
    brightness: float = 0.1
    """The release's training color jitter (its config stores 0.1 for each of the four): brightness,
    contrast and saturation factors drawn in [1 - a, 1 + a]; applied by a training pipeline, not here."""
    contrast: float = 0.1
    saturation: float = 0.1
    hue: float = 0.1
    """Hue shift range as a fraction of a turn, as the release's config gives it (0.1 = +-36 degrees)."""


def to_channels_first(images: torch.Tensor) -> torch.Tensor:
    """[..., H, W, 3] or [..., 3, H, W] -> [..., 3, H, W] (channel-last is recognised by a last dim of 3)."""
    if images.shape[-1] == 3 and images.shape[-3] != 3:
        return images.movedim(-1, -3)
    if images.shape[-3] != 3:
        raise ValueError(f"images must be [..., 3, H, W] or [..., H, W, 3], got {tuple(images.shape)}")
    return images


def preprocess_images(images: torch.Tensor | Sequence[torch.Tensor], spec: ImageSpec) -> torch.Tensor:
    """uint8 frames -> normalized float32 [B, V, 3, h, w] at spec.size, as the release prepares them for
    inference.

    `images`: one tensor [B, V, 3, H, W] (or channel-last), or a sequence of V per-camera tensors
    [B, 3, H_v, W_v] (or [B, H_v, W_v, 3]) whose sizes and aspect ratios may differ. Runs on the frames'
    device. Per camera: letterbox (`spec.letterbox`), crop `spec.crop_fraction` of each side around the
    centre, antialiased bilinear resize.
    """
    views = camera_views(images)
    batch = views[0].shape[0]
    if any(v.shape[0] != batch for v in views):
        raise ValueError(f"cameras disagree on the batch size: {[tuple(v.shape) for v in views]}")
    out = torch.empty(batch, len(views), 3, *spec.size, dtype=torch.float32, device=views[0].device)
    for v, frames in enumerate(views):
        if spec.letterbox:
            frames = letterbox(frames, spec.size)
        height, width = frames.shape[-2:]
        crop_h, crop_w = max(1, int(height * spec.crop_fraction)), max(1, int(width * spec.crop_fraction))
        top, left = (height - crop_h) // 2, (width - crop_w) // 2  # as the release's center crop computes it
        crop = frames[:, :, top : top + crop_h, left : left + crop_w]
        resized = F.interpolate(
            crop.to(torch.float32), size=spec.size, mode="bilinear", align_corners=False, antialias=True
        )
        out[:, v] = resized.clamp(0.0, 255.0) / 255.0
    return (out - spec.mean) / spec.std


def camera_views(images: torch.Tensor | Sequence[torch.Tensor]) -> list[torch.Tensor]:
    """Per-camera uint8 [B, 3, H, W] tensors from [B, V, 3, H, W] / [B, V, H, W, 3] or a sequence of
    [B, 3, H, W] / [B, H, W, 3] (a [B, 3, H, W] tensor alone is one camera)."""
    if isinstance(images, (list, tuple)):
        views = [to_channels_first(torch.as_tensor(v)) for v in images]
        bad = [tuple(v.shape) for v in views if v.ndim != 4]
        if not views or bad:
            raise ValueError(f"each camera must be [B, 3, H, W] or [B, H, W, 3], got {bad or 'no cameras'}")
        return views
    images = to_channels_first(torch.as_tensor(images))
    if images.ndim == 4:
        images = images[:, None]
    if images.ndim != 5:
        raise ValueError(f"images must be [B, V, 3, H, W], got {tuple(images.shape)}")
    return list(images.unbind(1))


def letterbox(frames: torch.Tensor, size: tuple[int, int]) -> torch.Tensor:
    """[..., 3, H, W] padded with zeros, centred, to the aspect ratio of size (h, w); unchanged if already.
    Like the release's LetterBoxPad: the bars split evenly, the odd pixel at the bottom or right."""
    height, width = frames.shape[-2:]
    if width * size[0] > height * size[1]:  # wider than the target
        padded_h, padded_w = max(height, round(width * size[0] / size[1])), width
    else:
        padded_h, padded_w = height, max(width, round(height * size[1] / size[0]))
    if (padded_h, padded_w) == (height, width):
        return frames
    top, left = (padded_h - height) // 2, (padded_w - width) // 2
    out = frames.new_zeros(*frames.shape[:-2], padded_h, padded_w)
    out[..., top : top + height, left : left + width] = frames
    return out
