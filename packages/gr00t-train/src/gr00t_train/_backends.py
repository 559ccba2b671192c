"""Process-wide torch switches a run sets (TF32, cuDNN autotuning, cuBLAS's workspace), restored when the
run ends, and the environment variable that asks for the workspace, removed when the run ends.

They are global to the process: left on, TF32 changes every later fp32 matmul of the caller (a test that
compares GPU and CPU results after a training run failed because of it)."""

from __future__ import annotations

import logging
import os
from collections.abc import Callable

import torch

from ._distributed import device_type
from .config.sections import TrainConfig

log = logging.getLogger(__name__)

# torch 2.11 and older read this once, at the process's first cuBLAS call; later torch also has a runtime setter.
WORKSPACE_ENV = "CUBLAS_WORKSPACE_CONFIG"
_ZERO = ":0:0"
_ours = False
"""Whether the variable in the environment is this process's own request (a nested request stays quiet)."""


def wants_zero_gemm_workspace(cfg: TrainConfig) -> bool:
    """Whether the run asks cuBLAS for no workspace (`optimizations.gemm_workspace`)."""
    choice = cfg.optimizations.gemm_workspace
    on_cuda = device_type(cfg.device) == "cuda"
    return choice == "zero" or (choice == "auto" and on_cuda and cfg.optimizations.graph != "eager")


def request_zero_gemm_workspace(cfg: TrainConfig) -> Callable[[], None]:
    """For torch without a runtime setter (2.11 and older): put `CUBLAS_WORKSPACE_CONFIG=:0:0` in the
    environment before the process's first cuBLAS call (run_training calls this first thing). A value the
    caller set is kept. Returns what takes the variable out again when the run ends: torch has read it by
    then (this process keeps its workspace size), but processes started later (a test's subprocess, the
    next command of a notebook) would inherit it."""
    global _ours
    if not wants_zero_gemm_workspace(cfg) or hasattr(torch.backends.cuda, "cublas_workspace_size"):
        return _nothing
    if WORKSPACE_ENV in os.environ:
        if not (_ours and os.environ[WORKSPACE_ENV] == _ZERO):  # ours: the outer call takes it out
            log.info("%s=%s set by the caller: kept", WORKSPACE_ENV, os.environ[WORKSPACE_ENV])
        return _nothing
    os.environ[WORKSPACE_ENV] = _ZERO
    _ours = True

    def take_out() -> None:
        global _ours
        _ours = False
        if os.environ.get(WORKSPACE_ENV) == _ZERO:
            del os.environ[WORKSPACE_ENV]

    return take_out


def _nothing() -> None:
    pass


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
        self._take_out_env: Callable[[], None] = _nothing

    def apply(self) -> BackendSwitches:
        """Set the run's switches (remembering the caller's)."""
        if self._saved is None:
            self._saved = _read()
            if wants_zero_gemm_workspace(self.cfg) and hasattr(torch.backends.cuda, "cublas_workspace_size"):
                self._saved_workspace = torch.backends.cuda.cublas_workspace_size()
        _write(self.wanted)
        if self._saved_workspace is not None:
            torch.backends.cuda.cublas_workspace_size(0)
        elif self._take_out_env is _nothing:
            # effective only if cuBLAS has not run in this process; taken out again by restore()
            self._take_out_env = request_zero_gemm_workspace(self.cfg)
        return self

    def restore(self) -> None:
        """Put the caller's switches back, and take out the environment variable apply() set (torch has read it
        by then: this process keeps the workspace size it asked for)."""
        if self._saved is not None:
            _write(self._saved)
            self._saved = None
        if self._saved_workspace is not None:
            torch.backends.cuda.cublas_workspace_size(self._saved_workspace)
            self._saved_workspace = None
        self._take_out_env()
        self._take_out_env = _nothing
