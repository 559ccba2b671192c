"""The plain-torch backend of batched image transforms (CPU or GPU tensors, one set of batched kernels).

Crop + resize is a separable linear map: two batched matrix products with per-image weight matrices that
follow DALI's linear resampling (triangle filter widened when downscaling, i.e. antialiased; borders
clamped). Color ops follow DALI's `brightness_contrast` and `hsv` formulas, so both backends agree.
"""

from __future__ import annotations

import math

import numpy as np
import torch

from ._augment_params import ImageParams, ImageTransformConfig

# RGB -> YIQ, the space in which DALI's hsv operator rotates hue and scales saturation
_YIQ = torch.tensor(
    [[0.299, 0.587, 0.114], [0.596, -0.274, -0.321], [0.211, -0.523, 0.311]], dtype=torch.float64
)
CONTRAST_CENTER = 127.5


def resample_weights(start: torch.Tensor, end: torch.Tensor, out_size: int, in_size: int) -> torch.Tensor:
    """(N, out_size, in_size) weights mapping the span [start, end) of each input row/column to out_size."""
    scale = (end - start) / out_size  # input pixels per output pixel
    centers = (
        start[:, None]
        + (torch.arange(out_size, dtype=start.dtype, device=start.device) + 0.5) * scale[:, None]
    )
    support = scale.clamp(min=1.0)  # widen the triangle when downscaling: antialiasing
    pad = int(math.ceil(float(support.max()))) + 1
    taps = torch.arange(-pad, in_size + pad, dtype=start.dtype, device=start.device) + 0.5
    w = (1 - (taps[None, None, :] - centers[:, :, None]).abs() / support[:, None, None]).clamp(min=0)
    w = w / w.sum(-1, keepdim=True)
    # clamp-to-edge: weights of taps outside the image land on the nearest edge pixel
    index = (torch.arange(-pad, in_size + pad, device=start.device).clamp(0, in_size - 1)).expand_as(w)
    return torch.zeros(w.shape[0], out_size, in_size, dtype=w.dtype, device=w.device).scatter_add_(
        2, index, w
    )


def color_matrices(params: ImageParams, device: torch.device) -> torch.Tensor:
    """(N, 3, 3) matrices of DALI's hsv (hue rotation, saturation scaling in YIQ), value fixed at 1."""
    hue = torch.as_tensor(np.deg2rad(params.hue), dtype=torch.float64)
    sat = torch.as_tensor(params.saturation, dtype=torch.float64)
    cos, sin = hue.cos(), hue.sin()
    zeros, ones = torch.zeros_like(hue), torch.ones_like(hue)
    # DALI rotates by -hue in this parametrisation (checked numerically against fn.hsv)
    rot = torch.stack([ones, zeros, zeros, zeros, cos, sin, zeros, -sin, cos], -1).view(-1, 3, 3)
    scale = torch.diag_embed(torch.stack([ones, sat, sat], -1))
    yiq = _YIQ.to(hue.dtype)
    return (torch.linalg.inv(yiq) @ scale @ rot @ yiq).to(device=device, dtype=torch.float32)


def apply_torch(frames: torch.Tensor, params: ImageParams, cfg: ImageTransformConfig) -> torch.Tensor:
    """uint8 (N, C, H, W) frames -> normalized (N, C, h, w) in `cfg.output_dtype`, on the frames' device."""
    n, c, height, width = frames.shape
    device = frames.device
    x = frames.to(torch.float32)
    out_h, out_w = cfg.size
    if not (params.full_frame(height, width) and (out_h, out_w) == (height, width)):

        def edges(a: np.ndarray) -> torch.Tensor:
            return torch.as_tensor(a, dtype=torch.float32, device=device)

        wy = resample_weights(edges(params.y0), edges(params.y1), out_h, height)
        wx = resample_weights(edges(params.x0), edges(params.x1), out_w, width)
        x = (wy[:, None] @ x) @ wx.transpose(1, 2)[:, None]
    if cfg.jitter:
        b = torch.as_tensor(params.brightness, dtype=torch.float32, device=device).view(n, 1, 1, 1)
        k = torch.as_tensor(params.contrast, dtype=torch.float32, device=device).view(n, 1, 1, 1)
        x = b * (CONTRAST_CENTER + k * (x - CONTRAST_CENTER))
        if cfg.saturation or cfg.hue:
            m = color_matrices(params, device)
            x = torch.einsum("nij,njhw->nihw", m, x)
        x = x.clamp(0.0, 255.0)
    mean = torch.tensor(cfg.mean, dtype=torch.float32, device=device).view(1, c, 1, 1) * 255.0
    std = torch.tensor(cfg.std, dtype=torch.float32, device=device).view(1, c, 1, 1) * 255.0
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
