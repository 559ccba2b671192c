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

OUTPUT_DTYPES = ("float32", "bfloat16", "float16")


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


def _draw(cfg: ImageTransformConfig, rng: np.random.Generator, height: int, width: int) -> list[float]:
    area = height * width * rng.uniform(*cfg.crop_scale)
    lo, hi = cfg.crop_ratio or (width / height, width / height)
    ratio = math.exp(rng.uniform(math.log(lo), math.log(hi)))
    w = min(float(width), math.sqrt(area * ratio))
    h = min(float(height), math.sqrt(area / ratio))
    x0 = rng.uniform(0, width - w) if w < width else 0.0
    y0 = rng.uniform(0, height - h) if h < height else 0.0
    return [
        y0, x0, y0 + h, x0 + w,
        rng.uniform(1 - cfg.brightness, 1 + cfg.brightness),
        rng.uniform(1 - cfg.contrast, 1 + cfg.contrast),
        rng.uniform(1 - cfg.saturation, 1 + cfg.saturation),
        rng.uniform(-cfg.hue, cfg.hue),
    ]  # fmt: skip


def sample_params(
    cfg: ImageTransformConfig,
    num_samples: int,
    num_views: int,
    height: int,
    width: int,
    seeds: Sequence[int] | np.ndarray | None = None,
    rng: np.random.Generator | None = None,
) -> ImageParams:
    """Parameters for `num_samples * num_views` images. With `seeds` (one per sample) each sample's draws
    depend only on its seed and view, so the same sample is augmented the same way in any batch."""
    rows = []
    for b in range(num_samples):
        shared = None
        for v in range(num_views):
            if seeds is not None:
                view = 0 if cfg.same_across_views else v
                gen = np.random.default_rng([int(seeds[b]) & 0xFFFFFFFFFFFF, view, 0x5EED])
            else:
                gen = rng or np.random.default_rng(cfg.seed)
            if cfg.same_across_views and shared is not None:
                rows.append(shared)
                continue
            shared = _draw(cfg, gen, height, width)
            rows.append(shared)
    table = np.asarray(rows, dtype=np.float64).reshape(-1, 8)
    return ImageParams(*(table[:, i] for i in range(8)))
