"""The DALI backend of batched image transforms: uint8 frames fed through `external_source`.

One DALI pipeline per (device, batch capacity): `fn.resize` with a per-image region of interest (crop and
resize in one antialiased linear resampling), `fn.brightness_contrast`, `fn.hsv`, a clamp, and
`fn.crop_mirror_normalize` to planar float. On GPU all operators run on the GPU (`device="gpu"`; CPU
frames are moved there first); on a machine without a GPU the same graph runs on CPU with `device_id=None`.
"""

from __future__ import annotations

import numpy as np
import torch

from ._augment_params import ImageParams, ImageTransformConfig
from ._augment_torch import CONTRAST_CENTER
from ._errors import missing_extra

_INPUTS = ("frames", "roi_start", "roi_end", "brightness", "contrast", "saturation", "hue")


def dali_error() -> Exception | None:
    """Why DALI cannot be used here (None when it can)."""
    try:
        import nvidia.dali  # noqa: F401
    except Exception as err:
        return err
    return None


def _extra_name() -> str:
    major = (torch.version.cuda or "13").split(".")[0]
    return f"dali-cu{major}"


class DaliImageTransform:
    """Runs `ImageTransformConfig` with DALI on CPU (`device="cpu"`) or GPU (`device="cuda[:i]"`)."""

    def __init__(
        self, cfg: ImageTransformConfig, device: str | torch.device = "cpu", num_threads: int = 2
    ) -> None:
        err = dali_error()
        if err is not None:
            raise missing_extra("nvidia-dali", _extra_name(), err)
        self.cfg, self.device, self.num_threads = cfg, torch.device(device), num_threads
        self._pipes: dict[int, object] = {}

    def _pipeline(self, batch_size: int):
        capacity = next((c for c in sorted(self._pipes) if c >= batch_size), None)
        if capacity is None:
            capacity = max(batch_size, 2 * max(self._pipes, default=0))
            self._pipes[capacity] = self._build(capacity)
        return self._pipes[capacity]

    def _build(self, batch_size: int):
        from nvidia.dali import fn, math, pipeline_def, types

        cfg, on_gpu = self.cfg, self.device.type == "cuda"
        device_id = (self.device.index or 0) if on_gpu else None

        # a synchronous, unpipelined executor: each call feeds one batch and runs it
        @pipeline_def(
            batch_size=batch_size, num_threads=self.num_threads, device_id=device_id,
            prefetch_queue_depth=1, exec_async=False, exec_pipelined=False,
        )  # fmt: skip
        def graph():
            frames = fn.external_source(
                name="frames", layout="HWC", dtype=types.UINT8, device="gpu" if on_gpu else "cpu"
            )
            args = {n: fn.external_source(name=n, dtype=types.FLOAT) for n in _INPUTS[1:]}
            x = fn.resize(
                frames, size=list(cfg.size), roi_start=args["roi_start"], roi_end=args["roi_end"],
                roi_relative=False, interp_type=types.INTERP_LINEAR, antialias=True, dtype=types.FLOAT,
            )  # fmt: skip
            if cfg.jitter:
                x = fn.brightness_contrast(
                    x,
                    brightness=args["brightness"],
                    contrast=args["contrast"],
                    contrast_center=CONTRAST_CENTER,
                )
                if cfg.saturation or cfg.hue:
                    x = fn.hsv(x, hue=args["hue"], saturation=args["saturation"], dtype=types.FLOAT)
                x = math.clamp(x, 0.0, 255.0)
            out_type = {"float32": types.FLOAT, "float16": types.FLOAT16}.get(cfg.output_dtype, types.FLOAT)
            return fn.crop_mirror_normalize(
                x, dtype=out_type, output_layout="CHW",
                mean=[255.0 * m for m in cfg.mean], std=[255.0 * s for s in cfg.std],
            )  # fmt: skip

        pipe = graph()
        pipe.build()
        return pipe

    def _used_inputs(self) -> list[str]:
        """Argument inputs the graph reads (DALI prunes the others and refuses data for them)."""
        names = ["roi_start", "roi_end"]
        if self.cfg.jitter:
            names += ["brightness", "contrast"]
            if self.cfg.saturation or self.cfg.hue:
                names += ["saturation", "hue"]
        return names

    def __call__(self, frames: torch.Tensor, params: ImageParams) -> torch.Tensor:
        """uint8 (N, C, H, W) -> normalized (N, C, h, w) on this transform's device."""
        n = frames.shape[0]
        pipe = self._pipeline(n)
        on_gpu = self.device.type == "cuda"
        nhwc = frames.to(self.device if on_gpu else "cpu").permute(0, 2, 3, 1).contiguous()
        stream = torch.cuda.current_stream(self.device).cuda_stream if on_gpu else None
        feeds = {
            "roi_start": np.stack([params.y0, params.x0], 1),
            "roi_end": np.stack([params.y1, params.x1], 1),
            "brightness": params.brightness, "contrast": params.contrast,
            "saturation": params.saturation, "hue": params.hue,
        }  # fmt: skip
        pipe.feed_input("frames", list(nhwc) if on_gpu else [f.numpy() for f in nhwc], cuda_stream=stream)
        for name in self._used_inputs():
            pipe.feed_input(name, [np.asarray(v, dtype=np.float32) for v in feeds[name]])
        (out,) = pipe.run(cuda_stream=stream) if on_gpu else pipe.run()
        return _to_torch(out, self.device, self.cfg.output_dtype, stream)


def _to_torch(out, device: torch.device, dtype: str, stream) -> torch.Tensor:
    dense = out.as_tensor()
    if device.type != "cuda":
        result = torch.from_numpy(np.array(dense))
    else:
        from nvidia.dali.plugin.pytorch import feed_ndarray

        result = torch.empty(
            dense.shape(), dtype=torch.float16 if dtype == "float16" else torch.float32, device=device
        )
        feed_ndarray(dense, result, cuda_stream=stream)
    return result.to(getattr(torch, dtype))
