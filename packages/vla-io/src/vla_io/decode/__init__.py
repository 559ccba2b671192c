"""Decoding video frames: readers that stay open (torchcodec on CPU or NVDEC, PyAV), FFmpeg loading for
torchcodec, the frames of a batch fetched per file and checked, an optional cache of decoded frames, and
`check_dataset`, which decodes a whole dataset and lists every bad file, episode and frame.

Modules: `readers` (`open_reader`, `ReaderCache`), `ffmpeg` (can torchcodec load, and how to fix it),
`frames` (`FrameFetcher`: one sorted request per file, times checked), `frame_cache` (`FrameCache`),
`check` (`check_dataset`, `vla-io check`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .._lazy import lazy_exports

_EXPORTS = {
    "VideoReader": ".readers",
    "available_backends": ".readers",
    "open_reader": ".readers",
    "FrameCache": ".frame_cache",
    "CheckReport": ".check",
    "check_dataset": ".check",
}
__all__ = [
    "CheckReport",
    "FrameCache",
    "VideoReader",
    "available_backends",
    "check_dataset",
    "open_reader",
]
__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)

if TYPE_CHECKING:
    from .check import CheckReport, check_dataset
    from .frame_cache import FrameCache
    from .readers import VideoReader, available_backends, open_reader
