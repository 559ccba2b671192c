"""Configuration and random parameters of batched image transforms, shared by the torch and DALI backends.

Both backends take the same `ImageParams`, so they can be compared image by image; parameters are drawn per
sample from a seed (the pipeline gives each sample its own), which makes augmentation reproducible and
independent of batching, ranks and the backend.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from .._seeds import mix64

OUTPUT_DTYPES = ("float32", "bfloat16", "float16")
CROP_POSITIONS = ("random", "center")


@dataclass(kw_only=True)
class ImageTransformConfig:
    """Resize (with an optional random crop), color jitter and normalization of uint8 RGB frames.

    Output = (jittered(resized_crop(x)) / 255 - mean) / std, float, (C, height, width).
    """

    size: tuple[int, int]
    """Output (height, width)."""
    crop_scale: tuple[float, float] = (1.0, 1.0)
    """Range of the fraction of the source area a random crop keeps; (1, 1) resizes the whole frame."""
    crop_ratio: tuple[float, float] | None = None
    """Range of crop aspect ratios (width / height); None keeps the source's ratio."""
    crop_position: str = "random"
    """Where the crop box sits: "random" (uniform over the frame) or "center" (e.g. for evaluation, with
    a fixed `crop_scale`)."""
    letterbox: bool = False
    """Pad each frame with black bars, centred, to the aspect ratio of `size` before cropping, so frames
    of any shape are never stretched (some VLA models' preprocessing pads every camera to a square)."""
    brightness: float = 0.0
    """Brightness factor drawn from [1 - brightness, 1 + brightness]."""
    contrast: float = 0.0
    """Contrast factor drawn from [1 - contrast, 1 + contrast], around mid-grey (127.5)."""
    saturation: float = 0.0
    """Saturation factor drawn from [1 - saturation, 1 + saturation]."""
    hue: float = 0.0
    """Hue rotation in degrees drawn from [-hue, hue] (DALI's `hsv` rotation in YIQ space)."""
    mean: tuple[float, float, float] = (0.0, 0.0, 0.0)
    """Per-channel mean subtracted after scaling to [0, 1]."""
    std: tuple[float, float, float] = (1.0, 1.0, 1.0)
    """Per-channel standard deviation divided after scaling to [0, 1]."""
    same_across_views: bool = False
    """Use one set of random parameters for all views (cameras, time steps) of a sample."""
    output_dtype: str = "float32"
    """Output dtype: float32, bfloat16 or float16."""
    seed: int = 0
    """Seed for calls that pass no per-sample seeds."""

    def __post_init__(self) -> None:
        self.size = (int(self.size[0]), int(self.size[1]))
        if min(self.size) < 1:
            raise ValueError(f"ImageTransformConfig.size must be positive (height, width), got {self.size}")
        lo, hi = self.crop_scale
        if not 0 < lo <= hi <= 1:
            raise ValueError(
                f"ImageTransformConfig.crop_scale must satisfy 0 < low <= high <= 1, got {self.crop_scale}"
            )
        if self.crop_position not in CROP_POSITIONS:
            raise ValueError(
                f"ImageTransformConfig.crop_position must be one of {CROP_POSITIONS}, got {self.crop_position!r}"
            )
        if self.crop_ratio is not None and not 0 < self.crop_ratio[0] <= self.crop_ratio[1]:
            raise ValueError(
                f"ImageTransformConfig.crop_ratio must satisfy 0 < low <= high, got {self.crop_ratio}"
            )
        for name in ("brightness", "contrast", "saturation"):
            if not 0 <= getattr(self, name) < 1:
                raise ValueError(f"ImageTransformConfig.{name} must be in [0, 1), got {getattr(self, name)}")
        if not 0 <= self.hue <= 180:
            raise ValueError(f"ImageTransformConfig.hue must be in [0, 180] degrees, got {self.hue}")
        if len(self.mean) != 3 or len(self.std) != 3 or min(self.std) <= 0:
            raise ValueError("ImageTransformConfig.mean and std need 3 values, std > 0")
        if self.output_dtype not in OUTPUT_DTYPES:
            raise ValueError(
                f"ImageTransformConfig.output_dtype must be one of {OUTPUT_DTYPES}, got {self.output_dtype!r}"
            )

    @property
    def jitter(self) -> bool:
        """Whether any color jitter is enabled."""
        return bool(self.brightness or self.contrast or self.saturation or self.hue)


@dataclass
class ImageParams:
    """Per-image parameters (N = samples x views, sample-major): crop box in pixels and jitter factors."""

    y0: np.ndarray
    x0: np.ndarray
    y1: np.ndarray
    x1: np.ndarray
    brightness: np.ndarray
    contrast: np.ndarray
    saturation: np.ndarray
    hue: np.ndarray

    def __len__(self) -> int:
        return len(self.y0)

    def full_frame(self, height: int, width: int) -> bool:
        """True when every crop box is the whole frame."""
        return bool(
            (self.y0 == 0).all()
            and (self.x0 == 0).all()
            and (self.y1 == height).all()
            and (self.x1 == width).all()
        )


def _uniforms(seeds: np.ndarray, num_views: int) -> np.ndarray:
    """(samples, views, 8) uniforms in [0, 1), each a hash of (seed, view, draw): per-sample random streams
    without building a generator per image (which cost more than the GPU work it parametrises)."""
    key = mix64(np.asarray(seeds, dtype=np.int64).astype(np.uint64) ^ np.uint64(0x5EED))
    streams = mix64(key[:, None] + np.arange(num_views, dtype=np.uint64)[None, :])
    with np.errstate(over="ignore"):
        draws = np.arange(1, 9, dtype=np.uint64) * np.uint64(0x9E3779B97F4A7C15)
    bits = mix64(streams[:, :, None] ^ draws[None, None, :])
    return (bits >> np.uint64(11)).astype(np.float64) * 2.0**-53


def _draw(cfg: ImageTransformConfig, u: np.ndarray, height: int, width: int) -> np.ndarray:
    """(N, 8) parameters [y0, x0, y1, x1, brightness, contrast, saturation, hue] from (N, 8) uniforms."""

    def between(lo: float, hi: float, x: np.ndarray) -> np.ndarray:
        return lo + (hi - lo) * x

    area = height * width * between(*cfg.crop_scale, u[:, 0])
    lo, hi = cfg.crop_ratio or (width / height, width / height)
    ratio = np.exp(between(math.log(lo), math.log(hi), u[:, 1]))
    w = np.minimum(float(width), np.sqrt(area * ratio))
    h = np.minimum(float(height), np.sqrt(area / ratio))
    # "center": the position draws become one half (the other draws keep their streams)
    ux, uy = (u[:, 2], u[:, 3]) if cfg.crop_position == "random" else (0.5, 0.5)
    x0 = np.where(w < width, ux * (width - w), 0.0)
    y0 = np.where(h < height, uy * (height - h), 0.0)
    return np.stack(
        [
            y0, x0, y0 + h, x0 + w,
            between(1 - cfg.brightness, 1 + cfg.brightness, u[:, 4]),
            between(1 - cfg.contrast, 1 + cfg.contrast, u[:, 5]),
            between(1 - cfg.saturation, 1 + cfg.saturation, u[:, 6]),
            between(-cfg.hue, cfg.hue, u[:, 7]),
        ],
        axis=1,
    )  # fmt: skip


def sample_params(
    cfg: ImageTransformConfig,
    num_samples: int,
    num_views: int,
    height: int,
    width: int,
    seeds: Sequence[int] | np.ndarray | None = None,
    rng: np.random.Generator | None = None,
) -> ImageParams:
    """Parameters for `num_samples * num_views` images (sample-major). With `seeds` (one per sample) each
    sample's draws depend only on its seed and view, so the same sample is augmented the same way in any
    batch; `same_across_views` gives every view of a sample the draws of view 0."""
    views = 1 if cfg.same_across_views else num_views
    if seeds is not None:
        u = _uniforms(np.asarray(seeds).reshape(-1)[:num_samples], views)
    else:
        u = (rng or np.random.default_rng(cfg.seed)).random((num_samples, views, 8))
    if views != num_views:
        u = np.repeat(u, num_views, axis=1)
    table = _draw(cfg, u.reshape(-1, 8), height, width)
    return ImageParams(*(table[:, i] for i in range(8)))
