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


class WorkerTimeoutError(WorkerError):
    """A worker is alive but has not delivered a batch within the timeout (a hung decoder, a stalled disk).
    `detail` says which batch and worker, `timeout_s` the limit, for callers that name their own setting."""

    def __init__(self, detail: str, timeout_s: float) -> None:
        self.detail, self.timeout_s = detail, timeout_s
        super().__init__(
            f"{detail}, longer than the {timeout_s:g} s limit; raise PipelineConfig.timeout_s if loading is "
            "just slow"
        )


SAMPLE_ERRORS = (DatasetFormatError, VideoDecodeError, FrameTimestampError, FileNotFoundError)
"""What a sample that cannot be decoded raises (the pipeline's `skip_bad_samples` skips exactly these)."""


class MissingExtraError(VlaIoError, ImportError):
    """An optional backend is not installed; the message names the extra to install."""


def missing_extra(package: str, extra: str, cause: BaseException | None = None) -> MissingExtraError:
    """An error telling the user which `vla-io[extra]` brings `package`."""
    detail = f" ({cause})" if cause else ""
    return MissingExtraError(
        f"{package} is not available{detail}. Install it with `pip install 'vla-io[{extra}]'`."
    )
