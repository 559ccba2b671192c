"""Letterboxing: pad a frame with black bars, centred, to a target aspect ratio, so that resizing it to
that shape never stretches it (some VLA models' preprocessing pads every camera to a square before cropping)."""

from __future__ import annotations

import torch


def letterbox_shape(height: int, width: int, aspect: tuple[int, int]) -> tuple[int, int, int, int]:
    """(padded height, padded width, top, left) for a height x width frame and an (h, w) aspect ratio.

    Only one side grows; the bars are split as evenly as possible, the extra pixel at the bottom or right.
    """
    ah, aw = aspect
    if width * ah > height * aw:  # wider than the target: bars above and below
        padded_h, padded_w = round(width * ah / aw), width
    else:
        padded_h, padded_w = height, round(height * aw / ah)
    padded_h, padded_w = max(padded_h, height), max(padded_w, width)
    return padded_h, padded_w, (padded_h - height) // 2, (padded_w - width) // 2


def letterbox(frames: torch.Tensor, aspect: tuple[int, int]) -> torch.Tensor:
    """(..., C, H, W) frames padded with zeros to `aspect` (returned unchanged when already there)."""
    height, width = frames.shape[-2:]
    padded_h, padded_w, top, left = letterbox_shape(height, width, aspect)
    if (padded_h, padded_w) == (height, width):
        return frames
    out = frames.new_zeros(*frames.shape[:-2], padded_h, padded_w)
    out[..., top : top + height, left : left + width] = frames
    return out
