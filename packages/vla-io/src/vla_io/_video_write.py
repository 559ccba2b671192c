"""Encode uint8 RGB frames into an mp4 file with PyAV (AV1 through SVT-AV1, or H.264 through x264)."""

from __future__ import annotations

import fractions
import os
from pathlib import Path
from types import TracebackType

import numpy as np

# codec name -> (FFmpeg encoder, default options). LeRobot's defaults: AV1, yuv420p, g=2, crf 30.
CODECS = {
    # preset 10, not LeRobot's 12: at 11+ SVT-AV1 left stale 64x64 blocks in our marker rows (checked)
    "av1": ("libsvtav1", {"crf": "30", "preset": "10"}),
    "h264": ("libx264", {"crf": "23", "preset": "veryfast"}),
}


class VideoWriter:
    """Append frames to one mp4 stream; frame i gets pts i/fps (a constant frame rate from 0)."""

    def __init__(self, path: str | Path, codec: str, fps: int, width: int, height: int, gop: int = 2) -> None:
        import av

        if codec not in CODECS:
            raise ValueError(f"codec must be one of {sorted(CODECS)}, got {codec!r}")
        os.environ.setdefault("SVT_LOG", "1")  # SVT-AV1 prints its banner on stderr otherwise
        encoder, options = CODECS[codec]
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        # faststart puts the index first, so a reader can seek without reading the whole file
        self._container = av.open(str(path), "w", options={"movflags": "faststart"})
        self._stream = self._container.add_stream(encoder, rate=fps, options=dict(options))
        self._stream.width, self._stream.height = width, height
        self._stream.pix_fmt = "yuv420p"
        self._stream.codec_context.gop_size = gop
        self._time_base = fractions.Fraction(1, fps)
        self._shape = (height, width, 3)
        self.frames_written = 0

    def write(self, frame: np.ndarray) -> None:
        """Encode one (H, W, 3) uint8 RGB frame."""
        import av

        if frame.shape != self._shape or frame.dtype != np.uint8:
            raise ValueError(
                f"expected a uint8 frame of shape {self._shape}, got {frame.dtype} {frame.shape}"
            )
        video_frame = av.VideoFrame.from_ndarray(np.ascontiguousarray(frame), format="rgb24")
        video_frame.pts = self.frames_written
        video_frame.time_base = self._time_base
        for packet in self._stream.encode(video_frame):
            self._container.mux(packet)
        self.frames_written += 1

    def close(self) -> None:
        """Flush the encoder and finish the file."""
        for packet in self._stream.encode():
            self._container.mux(packet)
        self._container.close()

    def __enter__(self) -> VideoWriter:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, err: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()
