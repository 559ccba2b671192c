"""Frames that carry their own index: a grid of black/white cells drawn into the top rows.

Synthetic datasets stamp frame `g` of camera `c` with `frame_marker(g, c)` (`g * 16 + c`), so tests can
check that the decoder returned the right frame: `read_frame_marker(frame)` gives back (g, c). The value is written twice (bits and their complements) so a misread is detected.
"""

from __future__ import annotations

import numpy as np

BITS = 16  # cells per row; two rows carry the low and high 16 bits, two more their complements
ROWS = 4
_DARK, _LIGHT = 16, 240


def marker_cell(size: int) -> int:
    """Edge length in pixels of one marker cell for an image of width `size`."""
    if size < 64:
        raise ValueError(f"image width must be >= 64 to carry a frame marker, got {size}")
    return size // BITS


def draw_marker(image: np.ndarray, value: int) -> None:
    """Write `value` (0 <= value < 2**32) into the top rows of an (H, W, 3) uint8 image, in place."""
    if not 0 <= value < 2**32:
        raise ValueError(f"marker value must be in [0, 2**32), got {value}")
    cell = marker_cell(image.shape[1])
    words = [value & 0xFFFF, value >> 16]
    rows = [*words, *(~w & 0xFFFF for w in words)]
    for r, word in enumerate(rows):
        for b in range(BITS):
            level = _LIGHT if (word >> b) & 1 else _DARK
            image[r * cell : (r + 1) * cell, b * cell : (b + 1) * cell] = level


def read_marker(image: np.ndarray) -> int:
    """The value stored by `draw_marker` in an (H, W, 3) or (3, H, W) uint8 image (possibly lossy-coded)."""
    img = np.asarray(image)
    if img.ndim == 3 and img.shape[0] == 3 and img.shape[-1] != 3:
        img = img.transpose(1, 2, 0)
    cell = marker_cell(img.shape[1])
    lo, hi = cell // 4, cell - cell // 4  # sample cell centres, away from coding artefacts at edges
    bits = np.empty((ROWS, BITS), dtype=bool)
    for r in range(ROWS):
        for b in range(BITS):
            patch = img[r * cell + lo : r * cell + hi, b * cell + lo : b * cell + hi]
            bits[r, b] = patch.astype(np.float32).mean() > 128
    if not np.all(bits[:2] != bits[2:]):
        raise ValueError("no valid frame marker in this image (bits and complements disagree)")
    weights = 1 << np.arange(BITS)
    low, high = (int((row * weights).sum()) for row in bits[:2])
    return low | (high << 16)


def frame_marker(global_index: int, camera: int) -> int:
    """The marker value of frame `global_index` of camera `camera` (< 16) in a synthetic dataset."""
    return global_index * 16 + camera


def read_frame_marker(frame: np.ndarray) -> tuple[int, int]:
    """(global frame index, camera index) stamped into a frame of a synthetic dataset (HWC or CHW uint8)."""
    value = read_marker(frame)
    return value >> 4, value & 15
