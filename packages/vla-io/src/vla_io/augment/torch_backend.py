"""The plain-torch backend of batched image transforms (CPU or GPU tensors, one set of batched kernels).

Crop + resize is a separable linear map: two batched matrix products with per-image weight matrices that
follow DALI's linear resampling (triangle filter widened when downscaling, i.e. antialiased; borders
clamped). Color ops follow DALI's `brightness_contrast` and `hsv` formulas, so both backends agree.

On a GPU nothing here waits for the device: the per-image parameters travel in one table through pinned
memory (a copy from pageable memory, or reading a device value back, would block the calling thread until
the stream catches up, serializing host and device work).
"""

from __future__ import annotations

import math

import numpy as np
import torch

from .params import ImageParams, ImageTransformConfig

# RGB -> YIQ, the space in which DALI's hsv operator rotates hue and scales saturation
_YIQ = np.array([[0.299, 0.587, 0.114], [0.596, -0.274, -0.321], [0.211, -0.523, 0.311]], dtype=np.float64)
CONTRAST_CENTER = 127.5


def resample_weights(
    start: torch.Tensor, end: torch.Tensor, out_size: int, in_size: int, max_scale: float | None = None
) -> torch.Tensor:
    """(N, out_size, in_size) weights mapping the span [start, end) of each input row/column to out_size.

    `max_scale`: the largest (end - start) / out_size, when the caller knows it (saves reading it back
    from the device)."""
    scale = (end - start) / out_size  # input pixels per output pixel
    centers = (
        start[:, None]
        + (torch.arange(out_size, dtype=start.dtype, device=start.device) + 0.5) * scale[:, None]
    )
    support = scale.clamp(min=1.0)  # widen the triangle when downscaling: antialiasing
    widest = max(float(scale.max()) if max_scale is None else max_scale, 1.0)
    pad = int(math.ceil(widest)) + 1
    taps = torch.arange(-pad, in_size + pad, dtype=start.dtype, device=start.device) + 0.5
    w = (1 - (taps[None, None, :] - centers[:, :, None]).abs() / support[:, None, None]).clamp(min=0)
    w = w / w.sum(-1, keepdim=True)
    # clamp-to-edge: weights of taps outside the image land on the nearest edge pixel
    index = (torch.arange(-pad, in_size + pad, device=start.device).clamp(0, in_size - 1)).expand_as(w)
    return torch.zeros(w.shape[0], out_size, in_size, dtype=w.dtype, device=w.device).scatter_add_(
        2, index, w
    )


def color_matrices(params: ImageParams) -> np.ndarray:
    """(N, 3, 3) float64 matrices of DALI's hsv (hue rotation, saturation scaling in YIQ), value fixed at 1."""
    hue = np.deg2rad(np.asarray(params.hue, dtype=np.float64))
    sat = np.asarray(params.saturation, dtype=np.float64)
    cos, sin = np.cos(hue), np.sin(hue)
    zeros, ones = np.zeros_like(hue), np.ones_like(hue)
    # DALI rotates by -hue in this parametrisation (checked numerically against fn.hsv)
    rot = np.stack([ones, zeros, zeros, zeros, cos, sin, zeros, -sin, cos], -1).reshape(-1, 3, 3)
    scale = np.stack([ones, zeros, zeros, zeros, sat, zeros, zeros, zeros, sat], -1).reshape(-1, 3, 3)
    return np.linalg.inv(_YIQ) @ scale @ rot @ _YIQ


# columns of the per-image parameter table
_BOX, _GAIN, _MATRIX, _MEAN, _STD, _WIDTH = (
    slice(0, 4),
    slice(4, 6),
    slice(6, 15),
    slice(15, 18),
    slice(18, 21),
    21,
)


def _parameter_table(params: ImageParams, cfg: ImageTransformConfig, device: torch.device) -> torch.Tensor:
    """(N, 21) float32 on `device`: crop box (y0, y1, x0, x1), brightness, contrast, color matrix (9),
    mean and std (3 each, on the 0..255 scale); uploaded in one non-blocking copy from pinned memory."""
    table = np.zeros((len(params), _WIDTH), dtype=np.float32)
    table[:, _BOX] = np.stack([params.y0, params.y1, params.x0, params.x1], 1)
    table[:, _GAIN] = np.stack([params.brightness, params.contrast], 1)
    if cfg.saturation or cfg.hue:
        table[:, _MATRIX] = color_matrices(params).reshape(-1, 9)
    table[:, _MEAN] = np.asarray(cfg.mean) * 255.0
    table[:, _STD] = np.asarray(cfg.std) * 255.0
    host = torch.from_numpy(table)
    if device.type != "cuda":
        return host
    return host.pin_memory().to(device, non_blocking=True)  # the pinned block is kept until the copy ends


def apply_torch(frames: torch.Tensor, params: ImageParams, cfg: ImageTransformConfig) -> torch.Tensor:
    """uint8 (N, C, H, W) frames -> normalized (N, C, h, w) in `cfg.output_dtype`, on the frames' device."""
    n, c, height, width = frames.shape
    table = _parameter_table(params, cfg, frames.device)
    x = frames.to(torch.float32)
    out_h, out_w = cfg.size
    if not (params.full_frame(height, width) and (out_h, out_w) == (height, width)):
        y_scale = float(np.max(np.asarray(params.y1) - np.asarray(params.y0))) / out_h
        x_scale = float(np.max(np.asarray(params.x1) - np.asarray(params.x0))) / out_w
        wy = resample_weights(table[:, 0], table[:, 1], out_h, height, max_scale=y_scale)
        wx = resample_weights(table[:, 2], table[:, 3], out_w, width, max_scale=x_scale)
        x = (wy[:, None] @ x) @ wx.transpose(1, 2)[:, None]
    if cfg.jitter:
        b, k = table[:, 4].view(n, 1, 1, 1), table[:, 5].view(n, 1, 1, 1)
        x = b * (CONTRAST_CENTER + k * (x - CONTRAST_CENTER))
        if cfg.saturation or cfg.hue:
            x = torch.einsum("nij,njhw->nihw", table[:, _MATRIX].view(n, 3, 3), x)
        x = x.clamp(0.0, 255.0)
    mean, std = table[:, _MEAN].view(n, c, 1, 1), table[:, _STD].view(n, c, 1, 1)
    return ((x - mean) / std).to(getattr(torch, cfg.output_dtype))


def resize_uint8(frames: torch.Tensor, size: tuple[int, int]) -> torch.Tensor:
    """uint8 (N, C, H, W) -> uint8 (N, C, h, w), antialiased linear resampling of the whole frame."""
    n, _, height, width = frames.shape
    if (height, width) == tuple(size):
        return frames
    zeros = torch.zeros(n, dtype=torch.float64)
    wy = resample_weights(zeros, zeros + height, size[0], height).to(torch.float32)
    wx = resample_weights(zeros, zeros + width, size[1], width).to(torch.float32)
    x = (wy[:, None] @ frames.to(torch.float32)) @ wx.transpose(1, 2)[:, None]
    return x.round_().clamp_(0, 255).to(torch.uint8)
