"""Which image backend `ImageAugment(backend="auto")` runs: the one a recorded measurement found faster
on that kind of device, when it is installed; torch where nothing was measured."""

from __future__ import annotations

MEASURED_FASTER: dict[str, str] = {}
"""Device type ("cuda", "cpu") -> the backend measured faster there by `benchmarks/augment_backends.py`
(batches of 16 samples x 2 cameras, resize + crop + color jitter + normalize; results in BENCHMARKS.md).
A device type that is not listed has not been measured: "auto" then runs torch, which needs nothing
beyond torch. Update this table from a new measurement, never by guess."""


def auto_backend(device_type: str) -> str:
    """ "dali" where it was measured faster on `device_type` and it imports here, else "torch"."""
    if MEASURED_FASTER.get(device_type) != "dali":
        return "torch"
    from .dali_backend import dali_error

    return "dali" if dali_error() is None else "torch"
