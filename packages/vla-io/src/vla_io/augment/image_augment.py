"""`ImageAugment`: batched resize / crop / color jitter / normalize of uint8 frames, torch or DALI backend."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import torch

from .._seeds import SEED_KEY
from .backend_choice import auto_backend
from .letterbox import letterbox
from .params import ImageParams, ImageTransformConfig, sample_params
from .torch_backend import apply_torch

BACKENDS = ("torch", "dali", "auto")


class ImageAugment:
    """Transforms uint8 frames into normalized float images at `config.size`, batched.

    - `apply(frames, seeds=None)`: frames uint8 (B, C, H, W) or (B, V, C, H, W) on any device; returns
      (B, [V,] C, h, w) in `config.output_dtype` on the same device.
    - `augment(batch)`: for a batch dict, transforms `keys` (each (B, C, H, W) or
      (B, T, C, H, W)); every camera and time step is a view of the sample. With `stack_as`, the results are
      stacked into one (B, V, C, h, w) tensor under that key and the source keys are removed.

    Frames of any size and aspect ratio are accepted; cameras of different sizes are transformed one size
    at a time and then stacked. With `config.letterbox` each frame is first padded to the output's aspect
    ratio, so nothing is stretched.

    Random parameters come from the per-sample seeds in `batch["sample_seed"]` (set by `Pipeline`), else
    from a generator seeded with `config.seed`. Backends: "torch" (any device), "dali" (CPU, or GPU for CUDA
    frames), "auto" (per device, the backend recorded as faster there when it is installed, else torch; see
    `vla_io.augment.backend_choice`). Both give the same result within about 0.01 on the 0..255 scale before
    normalization (measured max 0.0075; see the README), so they are interchangeable.
    """

    def __init__(
        self,
        config: ImageTransformConfig,
        keys: Sequence[str] = (),
        *,
        backend: str = "torch",
        stack_as: str | None = None,
        dali_threads: int = 2,
    ) -> None:
        if backend not in BACKENDS:
            raise ValueError(f"ImageAugment backend must be one of {BACKENDS}, got {backend!r}")
        self.config, self.keys, self.backend, self.stack_as = config, list(keys), backend, stack_as
        self._dali_threads = dali_threads
        self._dali: dict[str, Any] = {}
        self._rng = np.random.default_rng(config.seed)

    def params(
        self, num_samples: int, num_views: int, height: int, width: int, seeds: Any = None
    ) -> ImageParams:
        """Random parameters for a batch (from per-sample seeds when given)."""
        seeds = None if seeds is None else np.asarray(torch.as_tensor(seeds).cpu()).reshape(-1)
        rng = None if seeds is not None else self._rng
        return sample_params(self.config, num_samples, num_views, height, width, seeds, rng)

    def backend_for(self, device: torch.device | str) -> str:
        """The backend that runs frames on `device` ("auto" resolved)."""
        device_type = torch.device(device).type
        return auto_backend(device_type) if self.backend == "auto" else self.backend

    def prepare(self, frames: torch.Tensor) -> torch.Tensor:
        """Frames as the transform crops them: letterboxed to the output's aspect ratio when configured."""
        return letterbox(frames, self.config.size) if self.config.letterbox else frames

    def run(self, frames: torch.Tensor, params: ImageParams) -> torch.Tensor:
        """The transform of uint8 (N, C, H, W) frames (already `prepare`d) with explicit parameters."""
        if frames.dtype != torch.uint8 or frames.ndim != 4:
            raise TypeError(
                f"ImageAugment expects uint8 (N, C, H, W) frames, got {frames.dtype} {tuple(frames.shape)}"
            )
        if self.backend_for(frames.device) == "torch":
            return apply_torch(frames, params, self.config)
        device = str(frames.device)
        if device not in self._dali:
            from .dali_backend import DaliImageTransform

            self._dali[device] = DaliImageTransform(self.config, frames.device, self._dali_threads)
        return self._dali[device](frames, params)

    def apply(
        self, frames: torch.Tensor, seeds: Any = None, params: ImageParams | None = None
    ) -> torch.Tensor:
        """uint8 (B, C, H, W) or (B, V, C, H, W) -> float (B, [V,] C, h, w) on the same device.
        Explicit `params` are in the coordinates of the `prepare`d (letterboxed) frames."""
        if frames.ndim not in (4, 5):
            raise ValueError(f"frames must be (B, C, H, W) or (B, V, C, H, W), got {tuple(frames.shape)}")
        return self._apply_prepared(self.prepare(frames), seeds, params)

    def _apply_prepared(
        self, frames: torch.Tensor, seeds: Any = None, params: ImageParams | None = None
    ) -> torch.Tensor:
        b, v = frames.shape[0], (frames.shape[1] if frames.ndim == 5 else 1)
        flat = frames.reshape(b * v, *frames.shape[-3:])
        params = params or self.params(b, v, flat.shape[-2], flat.shape[-1], seeds)
        out = self.run(flat, params)
        return out.view(b, v, *out.shape[1:]) if frames.ndim == 5 else out

    def __call__(self, batch: Mapping[str, Any]) -> dict[str, Any]:
        """Transform the image keys of a batch dict (see the class docstring)."""
        missing = [k for k in self.keys if k not in batch]
        if missing:
            raise KeyError(f"ImageAugment: keys {missing} not in the batch (it has {sorted(batch)})")
        if not self.keys:
            return dict(batch)
        views = [batch[k] if batch[k].ndim == 5 else batch[k][:, None] for k in self.keys]
        for key, v in zip(self.keys, views):
            if v.dtype != torch.uint8:
                raise TypeError(f"ImageAugment: {key!r} must be uint8 frames, got {v.dtype}")
        views = [self.prepare(v) for v in views]  # letterboxing first: cameras may then share a size
        b = views[0].shape[0]
        counts = [v.shape[1] for v in views]
        shapes = {tuple(v.shape[-2:]) for v in views}
        out = dict(batch)
        if len(shapes) == 1:  # one batched call for all cameras
            stacked = torch.cat(views, dim=1)
            params = self.params(b, stacked.shape[1], *shapes.pop(), batch.get(SEED_KEY))
            result = self._apply_prepared(stacked, params=params)
            parts = torch.split(result, counts, dim=1)
        else:  # cameras of different sizes: one call each, parameters still drawn per view index
            parts, offset = [], 0
            for v in views:
                params = self.params(b, offset + v.shape[1], *v.shape[-2:], batch.get(SEED_KEY))
                keep = np.arange(b)[:, None] * (offset + v.shape[1]) + np.arange(offset, offset + v.shape[1])
                parts.append(self._apply_prepared(v, params=_take(params, keep.reshape(-1))))
                offset += v.shape[1]
        if self.stack_as is not None:
            for key in self.keys:
                out.pop(key)
            out[self.stack_as] = torch.cat(parts, dim=1)
        else:
            for key, part in zip(self.keys, parts):
                out[key] = part if batch[key].ndim == 5 else part[:, 0]
        return out


def _take(params: ImageParams, index: np.ndarray) -> ImageParams:
    return ImageParams(*(getattr(params, f)[index] for f in params.__dataclass_fields__))
