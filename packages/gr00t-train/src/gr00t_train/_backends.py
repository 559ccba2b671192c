"""Process-wide torch switches a run sets (TF32, cuDNN autotuning), restored when the run ends.

They are global to the process: left on, TF32 changes every later fp32 matmul of the caller (a test that
compares GPU and CPU results after a training run failed because of it)."""

from __future__ import annotations

import torch

from ._config import TrainConfig


def _read() -> dict[str, bool]:
    return {
        "matmul_tf32": torch.backends.cuda.matmul.allow_tf32,
        "cudnn_tf32": torch.backends.cudnn.allow_tf32,
        "cudnn_benchmark": torch.backends.cudnn.benchmark,
    }


def _write(values: dict[str, bool]) -> None:
    torch.backends.cuda.matmul.allow_tf32 = values["matmul_tf32"]
    torch.backends.cudnn.allow_tf32 = values["cudnn_tf32"]
    torch.backends.cudnn.benchmark = values["cudnn_benchmark"]


class BackendSwitches:
    """`apply()` sets the switches `cfg.optimizations` asks for and remembers what was there;
    `restore()` puts that back. Both are idempotent, so a second `fit()` applies them again."""

    def __init__(self, cfg: TrainConfig) -> None:
        opts = cfg.optimizations
        self.wanted = {
            "matmul_tf32": opts.tf32,
            "cudnn_tf32": opts.tf32,
            "cudnn_benchmark": opts.cudnn_benchmark,
        }
        self._saved: dict[str, bool] | None = None

    def apply(self) -> BackendSwitches:
        """Set the run's switches (remembering the caller's)."""
        if self._saved is None:
            self._saved = _read()
        _write(self.wanted)
        return self

    def restore(self) -> None:
        """Put the caller's switches back."""
        if self._saved is not None:
            _write(self._saved)
            self._saved = None
