"""Fetching the video frames of a batch: requests grouped per file, sorted, decoded once, checked."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch

from .._errors import DatasetFormatError, FrameTimestampError, VideoDecodeError
from ..dataset.meta import Episode
from ..dataset.table import index_ranges
from .readers import ReaderCache, VideoReader
from .sizes import Size, size_text


@dataclass
class FrameRequest:
    """Frames of one camera wanted for a batch: for each flat slot, its episode and time in that episode's video."""

    key: str
    episodes: list[Episode]  # per slot
    times: np.ndarray  # seconds from the start of each slot's episode (float64)


class FrameFetcher:
    """Decodes the frames of requests through a per-process `ReaderCache`, checking every returned time and,
    where `sizes` names the camera, every frame's size (`decode.sizes`)."""

    def __init__(
        self, readers: ReaderCache, fps: float, tolerance_s: float, strict: bool,
        sizes: dict[str, Size] | None = None,
    ) -> None:  # fmt: skip
        self.readers, self.fps, self.tolerance_s, self.strict = readers, fps, tolerance_s, strict
        self.sizes = dict(sizes or {})
        self._checked: set[tuple[str, int]] = set()

    def __getstate__(self) -> dict:
        state = dict(self.__dict__)
        state["_checked"] = set()
        return state

    def fetch(self, request: FrameRequest, allocate: Callable[..., torch.Tensor]) -> torch.Tensor:
        """uint8 (slots, C, H, W) frames; `allocate(shape, device)` makes the output tensor."""
        by_file: dict[str, list[int]] = {}
        for slot, ep in enumerate(request.episodes):
            by_file.setdefault(str(ep.videos[request.key].path), []).append(slot)
        out: torch.Tensor | None = None
        for path, slots in by_file.items():
            frames, inverse, slots_arr = self._fetch_file(path, request, np.asarray(slots))
            expected = self.sizes.get(request.key)
            if expected is not None and tuple(frames.shape[-2:]) != expected:
                raise self._size_error(path, request, slots_arr, tuple(frames.shape[-2:]), expected)
            if out is None:
                out = allocate((len(request.episodes), *frames.shape[1:]), frames.device)
            elif frames.shape[1:] != out.shape[1:]:
                raise VideoDecodeError(
                    f"{path}: key {request.key!r} frames are {tuple(frames.shape[1:])}, other files gave {tuple(out.shape[1:])}"
                )
            for slot, source in zip(slots_arr.tolist(), inverse.tolist()):
                out[slot].copy_(frames[source])  # 30x faster than index_put on uint8 frames
        assert out is not None
        return out

    def _fetch_file(self, path: str, request: FrameRequest, slots: np.ndarray):
        key = request.key
        spans = [request.episodes[s].videos[key] for s in slots]
        file_times = np.array([sp.from_timestamp for sp in spans]) + request.times[slots]
        indices = np.rint(file_times * self.fps).astype(np.int64)
        first = request.episodes[slots[0]]
        try:
            reader = self.readers.get(path)
        except FileNotFoundError:
            raise FileNotFoundError(
                f"{path}: video of episode {first.index}, key {key!r} not found"
            ) from None
        except VideoDecodeError as err:
            raise VideoDecodeError(f"episode {first.index}, key {key!r}: {err}") from err
        for s in slots:
            self._check_span(reader, request.episodes[s], key)
        bad = (indices < 0) | (indices >= reader.num_frames)
        if bad.any():
            j = int(np.flatnonzero(bad)[0])
            ep = request.episodes[slots[j]]
            raise FrameTimestampError(
                f"{path}: episode {ep.index}, key {key!r}: time {request.times[slots[j]]:.4f} s (file time "
                f"{file_times[j]:.4f} s) is outside the video's {reader.num_frames} frames at {self.fps:g} fps"
            )
        unique, inverse = np.unique(indices, return_inverse=True)
        try:
            frames, pts = reader.frames_at(unique.tolist())
        except Exception as err:
            raise VideoDecodeError(
                f"{path}: episode {first.index}, key {key!r}: decoding frames {unique.tolist()[:8]} failed "
                f"({type(err).__name__}: {err})"
            ) from err
        error = np.abs(np.asarray(pts)[inverse] - file_times)
        if (error > self.tolerance_s).any():
            j = int(np.argmax(error))
            ep = request.episodes[slots[j]]
            raise FrameTimestampError(
                f"{path}: episode {ep.index}, key {key!r}: asked for the frame at {file_times[j]:.4f} s, the "
                f"decoder returned {float(np.asarray(pts)[inverse][j]):.4f} s (tolerance {self.tolerance_s} s)"
            )
        return frames, inverse.reshape(-1), slots

    def _size_error(
        self, path: str, request: FrameRequest, slots: np.ndarray, got: Size, expected: Size
    ) -> VideoDecodeError:
        """A file whose frames have another size than the camera's: it names the first episode asked for
        and its frames (one sample's episode and frame when the pipeline reloads a batch sample by sample)."""
        episode = request.episodes[int(slots[0])].index
        mine = [int(s) for s in slots if request.episodes[int(s)].index == episode]
        frames = sorted({int(f) for f in np.rint(request.times[mine] * self.fps)})
        return VideoDecodeError(
            f"{path}: episode {episode}, key {request.key!r}, frame{'s' if len(frames) > 1 else ''} "
            f"{index_ranges(frames)}: frames are "
            f"{size_text(got)} (height x width) where this camera's are {size_text(expected)}"
        )

    def _check_span(self, reader: VideoReader, ep: Episode, key: str) -> None:
        """The video must hold every frame of the episode (once per file and episode)."""
        span = ep.videos[key]
        if (reader.path, ep.index) in self._checked:
            return
        first = int(round(span.from_timestamp * self.fps))
        need = first + ep.length
        own_file = ep.dataset_from_index is None  # v2.x: one file per episode, so the counts must agree
        mismatch = reader.num_frames < need or (self.strict and own_file and reader.num_frames != ep.length)
        if mismatch:
            raise DatasetFormatError(
                f"{reader.path}: episode {ep.index}, key {key!r}: the video has {reader.num_frames} frames but "
                f"the episode needs frames {first}..{need - 1} ({ep.length} rows)"
            )
        self._checked.add((reader.path, ep.index))
