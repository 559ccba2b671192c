"""Fixtures for tests, benchmarks and demos: synthetic LeRobot datasets with real encoded mp4 files whose
frames carry their own index, and the tools that make them.

Modules: `synth` (`SynthConfig`, `SYNTH_PRESETS`, `write_synthetic_dataset`), `synth_content` (the
frames and rows), `synth_layout` (the v2.x / v3.0 files), `marker` (frame markers, `read_frame_marker`),
`video_write` (`VideoWriter`: mp4 encoding with PyAV).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .._lazy import lazy_exports

_EXPORTS = {
    "SYNTH_PRESETS": ".synth",
    "SynthConfig": ".synth",
    "write_synthetic_dataset": ".synth",
    "read_frame_marker": ".marker",
    "VideoWriter": ".video_write",
}
__all__ = [
    "SYNTH_PRESETS",
    "SynthConfig",
    "VideoWriter",
    "read_frame_marker",
    "write_synthetic_dataset",
]
__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)

if TYPE_CHECKING:
    from .marker import read_frame_marker
    from .synth import SYNTH_PRESETS, SynthConfig, write_synthetic_dataset
    from .video_write import VideoWriter
