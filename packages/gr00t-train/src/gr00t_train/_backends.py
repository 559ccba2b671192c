"""Process-wide torch switches a run sets (TF32, cuDNN autotuning, cuBLAS's workspace), restored when the
run ends.

They are global to the process: left on, TF32 changes every later fp32 matmul of the caller (a test that
compares GPU and CPU results after a training run failed because of it)."""

from __future__ import annotations

import logging
import os

import torch

from ._distributed import device_type
from .config.sections import TrainConfig

log = logging.getLogger(__name__)

# torch 2.11 and older read this once, at the process's first cuBLAS call; later torch also has a runtime setter.
WORKSPACE_ENV = "CUBLAS_WORKSPACE_CONFIG"


def wants_zero_gemm_workspace(cfg: TrainConfig) -> bool:
    """Whether the run asks cuBLAS for no workspace (`optimizations.gemm_workspace`)."""
    choice = cfg.optimizations.gemm_workspace
    on_cuda = device_type(cfg.device) == "cuda"
    return choice == "zero" or (choice == "auto" and on_cuda and cfg.optimizations.graph != "eager")


def request_zero_gemm_workspace(cfg: TrainConfig) -> None:
    """For torch without a runtime setter (2.11 and older): put `CUBLAS_WORKSPACE_CONFIG=:0:0` in the
    environment before the process's first cuBLAS call (run_training calls this first thing). A value the
    caller set is kept."""
    if not wants_zero_gemm_workspace(cfg) or hasattr(torch.backends.cuda, "cublas_workspace_size"):
        return
    if WORKSPACE_ENV in os.environ:
        log.info("%s=%s set by the caller: kept", WORKSPACE_ENV, os.environ[WORKSPACE_ENV])
        return
    os.environ[WORKSPACE_ENV] = ":0:0"


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
        self.cfg = cfg
        self._saved: dict[str, bool] | None = None
        self._saved_workspace: int | None = None

    def apply(self) -> BackendSwitches:
        """Set the run's switches (remembering the caller's)."""
        if self._saved is None:
            self._saved = _read()
            if wants_zero_gemm_workspace(self.cfg) and hasattr(torch.backends.cuda, "cublas_workspace_size"):
                self._saved_workspace = torch.backends.cuda.cublas_workspace_size()
        _write(self.wanted)
        if self._saved_workspace is not None:
            torch.backends.cuda.cublas_workspace_size(0)
        else:
            request_zero_gemm_workspace(self.cfg)  # effective only if cuBLAS has not run in this process
        return self

    def restore(self) -> None:
        """Put the caller's switches back (an environment variable torch has read stays: it can't be undone)."""
        if self._saved is not None:
            _write(self._saved)
            self._saved = None
        if self._saved_workspace is not None:
            torch.backends.cuda.cublas_workspace_size(self._saved_workspace)
            self._saved_workspace = None
