"""Exceptions raised by vla-io; each message names the file, episode and key involved."""

from __future__ import annotations


class VlaIoError(Exception):
    """Base class of every error vla-io raises on purpose."""


class DatasetFormatError(VlaIoError, ValueError):
    """A dataset on disk does not follow the LeRobot layout it claims (missing or inconsistent metadata)."""


class VideoDecodeError(VlaIoError, RuntimeError):
    """A video file could not be opened or decoded."""


class FrameTimestampError(VlaIoError, ValueError):
    """A requested frame lies outside the video, or the decoder returned a frame at another time."""


class WorkerError(VlaIoError, RuntimeError):
    """A pipeline worker failed; the message carries the worker's own traceback."""


class MissingExtraError(VlaIoError, ImportError):
    """An optional backend is not installed; the message names the extra to install."""


def missing_extra(package: str, extra: str, cause: BaseException | None = None) -> MissingExtraError:
    """An error telling the user which `vla-io[extra]` brings `package`."""
    detail = f" ({cause})" if cause else ""
    return MissingExtraError(
        f"{package} is not available{detail}. Install it with `pip install 'vla-io[{extra}]'`."
    )
