"""The DALI backend of batched image transforms: uint8 frames fed through `external_source`.

One DALI pipeline per (device, batch capacity): `fn.resize` with a per-image region of interest (crop and
resize in one antialiased linear resampling), `fn.brightness_contrast`, `fn.hsv`, a clamp, and
`fn.crop_mirror_normalize` to planar float. On GPU all operators run on the GPU (`device="gpu"`; CPU
frames are moved there first); on a machine without a GPU the same graph runs on CPU with `device_id=None`.
CPU and GPU share one feeding path (`feed_and_run`), so the CPU tests exercise the calls the GPU makes.
"""

from __future__ import annotations

import numpy as np
import torch

from .._errors import missing_extra
from .params import ImageParams, ImageTransformConfig
from .torch_backend import CONTRAST_CENTER

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

        # DALI's default (dynamic) executor with a queue of one: each call feeds one batch and runs it; only
        # this executor can return outputs ordered on a CUDA stream instead of synchronizing the host
        @pipeline_def(
            batch_size=batch_size, num_threads=self.num_threads, device_id=device_id, prefetch_queue_depth=1,
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
        pipe = self._pipeline(frames.shape[0])
        on_gpu = self.device.type == "cuda"
        # one dense (N, H, W, C) batch: a CUDA tensor for the GPU graph, a numpy array otherwise (DALI asks
        # torch for its current CUDA stream when given any torch tensor, which fails without a GPU)
        nhwc = frames.to(self.device if on_gpu else "cpu").permute(0, 2, 3, 1).contiguous()
        nhwc = nhwc if on_gpu else nhwc.numpy()
        stream = torch.cuda.current_stream(self.device).cuda_stream if on_gpu else None
        feeds = {
            "roi_start": np.stack([params.y0, params.x0], 1),
            "roi_end": np.stack([params.y1, params.x1], 1),
            "brightness": params.brightness, "contrast": params.contrast,
            "saturation": params.saturation, "hue": params.hue,
        }  # fmt: skip
        args = {name: np.ascontiguousarray(feeds[name], dtype=np.float32) for name in self._used_inputs()}
        (out,) = feed_and_run(pipe, nhwc, args, stream)
        return _to_torch(out, self.device, self.cfg.output_dtype, stream)


def feed_and_run(
    pipe, frames: torch.Tensor | np.ndarray, args: dict[str, np.ndarray], stream: int | None
) -> tuple:
    """Feed one batch and run it; the same calls on CPU (`stream=None`) and GPU (a raw CUDA stream).

    Every input is one dense array whose first axis is the batch (DALI cannot take the shape of Python
    scalars). `stream` goes to `run` positionally: its signature is `run(cuda_stream=None, /, **inputs)`,
    so a keyword `cuda_stream=` would be fed as an input of that name.
    """
    pipe.feed_input("frames", frames, cuda_stream=stream)
    for name, values in args.items():
        pipe.feed_input(name, values)  # per-image parameters: CPU arrays (N,) or (N, 2)
    return pipe.run(stream)


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
