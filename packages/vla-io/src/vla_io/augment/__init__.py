"""Batched image work on uint8 frames (letterbox, crop + resize, color jitter, normalize), on the GPU or
the CPU, with a plain torch backend or DALI; random parameters come from per-sample seeds.

Modules: `image_augment` (`ImageAugment`), `params` (`ImageTransformConfig`, `ImageParams`,
`sample_params`), `torch_backend`, `dali_backend`, `backend_choice` (what `backend="auto"` runs),
`letterbox`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .._lazy import lazy_exports

_EXPORTS = {
    "ImageAugment": ".image_augment",
    "ImageParams": ".params",
    "ImageTransformConfig": ".params",
    "sample_params": ".params",
}
__all__ = [
    "ImageAugment",
    "ImageParams",
    "ImageTransformConfig",
    "sample_params",
]
__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)

if TYPE_CHECKING:
    from .image_augment import ImageAugment
    from .params import ImageParams, ImageTransformConfig, sample_params
