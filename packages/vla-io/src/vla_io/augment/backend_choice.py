"""Which image backend `ImageAugment(backend="auto")` runs: the one a recorded measurement found faster
on that kind of device, when it is installed; torch where nothing was measured."""

from __future__ import annotations

MEASURED_FASTER: dict[str, str] = {"cuda": "torch"}
"""H200, 2026-12-01: DALI's step took 15-20% less GPU time per batch (1.67 vs 1.96 ms for two 256x256
cameras, 2.90 vs 3.63 ms for 480x640 + 256x256) but the pipeline delivered 7.2% and 2.5% fewer samples/s
with it (2625 vs 2827, 1270 vs 1302): not faster by the rule of benchmarks/augment_backends.py, so torch.

Device type ("cuda", "cpu") -> the backend measured faster there by `benchmarks/augment_backends.py`
(batches of 16 samples x 2 cameras, resize + crop + color jitter + normalize; results in BENCHMARKS.md).
A device type that is not listed has not been measured: "auto" then runs torch, which needs nothing
beyond torch. Update this table from a new measurement, never by guess."""


def auto_backend(device_type: str) -> str:
    """ "dali" where it was measured faster on `device_type` and it imports here, else "torch"."""
    if MEASURED_FASTER.get(device_type) != "dali":
        return "torch"
    from .dali_backend import dali_error

    return "dali" if dali_error() is None else "torch"
