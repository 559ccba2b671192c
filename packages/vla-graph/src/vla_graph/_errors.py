"""The two errors a user of vla_graph acts on."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any


class GraphCaptureError(RuntimeError):
    """A step cannot be captured as a CUDA graph; the message says which op did what and how to fix it.

    `findings` lists what the pre-capture check saw (empty when CUDA itself rejected the capture)."""

    def __init__(self, message: str, findings: Sequence[Any] = ()) -> None:
        super().__init__(message)
        self.findings = list(findings)


class ShapeChangeError(ValueError):
    """A batch differs in shape, dtype, device or Python value from the one a graph was captured with."""
