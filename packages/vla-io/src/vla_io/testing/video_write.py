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


class _KeepThreadScheduling:
    """Undo what SVT-AV1 does to the calling thread: where it may (as root), it switches the thread that
    opens or drives the encoder to real-time SCHED_FIFO priority 99. Left so, every process spawned later
    inherits it, and one spinning thread (a gloo transport loop, say) then owns a core that same-priority
    threads never get back; on 2 cores that froze our test runs. Call `restore()` after each encoder call."""

    def __init__(self) -> None:
        self._saved = None
        if hasattr(os, "sched_getscheduler"):  # Linux and some Unixes; pid 0 = the calling thread
            self._saved = (os.sched_getscheduler(0), os.sched_getparam(0))

    def restore(self) -> None:
        if self._saved is None:
            return
        policy, param = self._saved
        if os.sched_getscheduler(0) != policy or os.sched_getparam(0) != param:
            os.sched_setscheduler(0, policy, param)


class VideoWriter:
    """Append frames to one mp4 stream; frame i gets pts i/fps (a constant frame rate from 0)."""

    def __init__(self, path: str | Path, codec: str, fps: int, width: int, height: int, gop: int = 2) -> None:
        import av

        if codec not in CODECS:
            raise ValueError(f"codec must be one of {sorted(CODECS)}, got {codec!r}")
        os.environ.setdefault("SVT_LOG", "1")  # SVT-AV1 prints its banner on stderr otherwise
        self._scheduling = _KeepThreadScheduling()
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
        try:
            for packet in self._stream.encode(video_frame):
                self._container.mux(packet)
        finally:
            self._scheduling.restore()
        self.frames_written += 1

    def close(self) -> None:
        """Flush the encoder and finish the file."""
        try:
            for packet in self._stream.encode():
                self._container.mux(packet)
            self._container.close()
        finally:
            self._scheduling.restore()

    def __enter__(self) -> VideoWriter:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, err: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()
