"""Video readers that stay open: torchcodec (CPU or NVDEC) and PyAV, behind one small interface.

A reader returns frames by index in a file as uint8 (N, C, H, W) plus each frame's presentation time, so
the caller can check it got the frame it asked for. Readers are cached per process (`ReaderCache`): a worker
keeps one decoder per file instead of opening a new one for every frame.
"""

from __future__ import annotations

import logging
import os
from collections import OrderedDict
from collections.abc import Sequence
from typing import Protocol

import numpy as np
import torch

from .._errors import VideoDecodeError
from .ffmpeg import resolve_backend, torchcodec_error

log = logging.getLogger(__name__)
BACKENDS = ("auto", "torchcodec", "pyav")


class VideoReader(Protocol):
    """What the dataset needs from a decoder."""

    path: str
    num_frames: int
    device: torch.device

    def frames_at(self, indices: Sequence[int]) -> tuple[torch.Tensor, np.ndarray]:
        """Frames at sorted, unique `indices`: uint8 (N, C, H, W) and their times in seconds."""
        ...


def available_backends() -> list[str]:
    """Decoder backends that work in this environment, best first."""
    return (["torchcodec"] if torchcodec_error() is None else []) + ["pyav"]


class TorchCodecReader:
    """A long-lived torchcodec `VideoDecoder` for one file."""

    def __init__(self, path: str, device: str = "cpu", seek_mode: str = "exact", threads: int = 1) -> None:
        from torchcodec.decoders import VideoDecoder

        self.path, self.device = path, torch.device(device)
        kwargs = {"num_ffmpeg_threads": threads} if self.device.type == "cpu" else {}
        self._decoder = VideoDecoder(
            path, seek_mode=seek_mode, device=device, dimension_order="NCHW", **kwargs
        )
        self.num_frames = int(self._decoder.metadata.num_frames or 0)

    def frames_at(self, indices: Sequence[int]) -> tuple[torch.Tensor, np.ndarray]:
        batch = self._decoder.get_frames_at(indices=list(indices))
        return batch.data, batch.pts_seconds.numpy()


class PyAVReader:
    """Exact frame access with PyAV: packet times are indexed once; a forward read never seeks."""

    def __init__(self, path: str, threads: int = 1) -> None:
        import av

        self.path, self.device = path, torch.device("cpu")
        self._container = av.open(path)
        self._stream = self._container.streams.video[0]
        self._stream.codec_context.thread_count = threads
        packets = [(p.pts, p.is_keyframe) for p in self._container.demux(self._stream) if p.pts is not None]
        packets.sort()
        self._pts = np.array([p for p, _ in packets], dtype=np.int64)
        self._keyframes = np.array([p for p, key in packets if key], dtype=np.int64)
        self._time_base = float(self._stream.time_base)
        self.num_frames = len(self._pts)
        self._frames = None  # the running decode generator
        self._last_pts: int | None = None

    def _seek(self, target: int, back: int) -> None:
        self._container.seek(max(int(target) - back, 0), stream=self._stream, backward=True, any_frame=False)
        self._frames = self._container.decode(self._stream)
        self._last_pts = None

    def _needs_seek(self, target: int) -> bool:
        if self._frames is None or self._last_pts is None or target <= self._last_pts:
            return True
        # a keyframe between the current position and the target: jumping there is cheaper than decoding on
        k = np.searchsorted(self._keyframes, target, side="right") - 1
        return k >= 0 and self._keyframes[k] > self._last_pts

    def _decode_until(self, target: int) -> np.ndarray | None:
        for frame in self._frames:
            self._last_pts = frame.pts
            if frame.pts == target:
                return frame.to_ndarray(format="rgb24")
            if frame.pts > target:
                return None
        return None

    def frames_at(self, indices: Sequence[int]) -> tuple[torch.Tensor, np.ndarray]:
        out = []
        for i in indices:
            if not 0 <= i < self.num_frames:
                raise IndexError(f"{self.path}: frame {i} outside [0, {self.num_frames})")
            target = int(self._pts[i])
            image, back = None, 0
            for _ in range(6):  # the seek may land after the target on odd files: step further back
                if self._needs_seek(target) or back:
                    self._seek(target, back)
                image = self._decode_until(target)
                if image is not None:
                    break
                back = max(2 * back, int(self._pts[min(i, 1)] - self._pts[0]) or 1) * 4
            if image is None:
                raise VideoDecodeError(f"{self.path}: could not decode frame {i} (pts {target})")
            out.append(torch.from_numpy(image).permute(2, 0, 1))
        return torch.stack(out), self._pts[list(indices)] * self._time_base


def open_reader(
    path: str, backend: str = "auto", device: str = "cpu", seek_mode: str = "exact", threads: int = 1
) -> VideoReader:
    """Open a reader for one file; errors name the file."""
    if backend not in BACKENDS:
        raise ValueError(f"video backend must be one of {BACKENDS}, got {backend!r}")
    if not os.path.exists(path):
        raise FileNotFoundError(f"{path}: video file not found")
    if device != "cpu" and backend == "pyav":
        raise ValueError(f"decoding on {device!r} needs the torchcodec backend, not {backend!r}")
    backend = resolve_backend("torchcodec" if device != "cpu" else backend)  # auto: warns if PyAV
    try:
        if backend == "torchcodec":
            return TorchCodecReader(path, device, seek_mode, threads)
        return PyAVReader(path, threads)
    except Exception as err:
        raise VideoDecodeError(
            f"{path}: cannot open video with {backend} ({type(err).__name__}: {err})"
        ) from err


class ReaderCache:
    """Open readers of one process, least recently used closed first.

    Not simply "safe across fork": a forked child does not use the readers it inherited (their decoder
    state and file offsets are the parent's) and opens its own, but it must not free the inherited ones
    either. Freeing a PyAV reader that had decoded in the parent blocks the child forever: its pending
    frames hold FFmpeg's swscale context, whose worker threads exist only in the parent, and tearing that
    down waits on them (seen as a pipeline worker that never delivers, until `timeout_s`). So inherited
    readers are set aside, unused and never freed, until the child exits; copy-on-write makes that cheap.
    """

    def __init__(self, max_open: int = 32, **reader_kwargs: object) -> None:
        self.max_open = max_open
        self.reader_kwargs = reader_kwargs
        self._readers: OrderedDict[str, VideoReader] = OrderedDict()
        self._inherited: list[OrderedDict[str, VideoReader]] = []  # never closed: see the class doc
        self._pid = os.getpid()
        self.opened = 0  # readers this process has opened: more than its files means files were reopened
        self.evicted = 0  # readers closed to make room (`max_open`)

    def _own(self) -> OrderedDict[str, VideoReader]:
        """This process's readers; after a fork, the parent's are set aside (kept, not freed)."""
        if self._pid != os.getpid():
            self._inherited.append(self._readers)
            self._readers, self._pid = OrderedDict(), os.getpid()
            self.opened = self.evicted = 0  # the counts are per process
        return self._readers

    def stats(self) -> dict[str, int]:
        """This process's readers: `open` now, `opened` and `evicted` so far."""
        return {"open": len(self._own()), "opened": self.opened, "evicted": self.evicted}

    def get(self, path: str) -> VideoReader:
        """The open reader of `path`, opening it if needed."""
        readers = self._own()
        reader = readers.get(path)
        if reader is None:
            reader = open_reader(path, **self.reader_kwargs)  # type: ignore[arg-type]
            self.opened += 1
            readers[path] = reader
            while len(readers) > self.max_open:
                readers.popitem(last=False)
                self.evicted += 1
        else:
            readers.move_to_end(path)
        return reader

    def clear(self) -> None:
        """Close every reader this process opened (inherited ones stay set aside)."""
        self._own().clear()

    def __getstate__(self) -> dict:
        state = dict(self.__dict__)
        state["_readers"] = OrderedDict()  # open decoders never travel to another process
        state["_inherited"] = []
        return state
