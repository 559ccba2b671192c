"""`gr00t-train train` run in the caller's process (a notebook, a test) leaves the process as it found it:
the environment (processes started later inherit it), the SIGTERM/SIGINT handlers, and no thread of ours
still running, whether the run ends well or stops on bad data. A GPU test that ran after in-process runs
failed where it passed on its own."""

from __future__ import annotations

import os
import signal
import threading

import pytest
import torch
from gr00t_train._backends import WORKSPACE_ENV
from gr00t_train.cli import main

OURS = ("gr00t-train", "vla-io", "prefix-cache")


def _handler(signum, frame) -> None:  # the caller's own handler, which must be back after the run
    raise AssertionError(f"signal {signum} reached the caller's handler")


@pytest.fixture
def callers_state(monkeypatch):
    """A caller with its own SIGTERM/SIGINT handlers, on a torch without cuBLAS's runtime workspace setter
    (torch 2.11: the run asks through the environment) and without CUBLAS_WORKSPACE_CONFIG set."""
    monkeypatch.delattr(torch.backends.cuda, "cublas_workspace_size", raising=False)
    if WORKSPACE_ENV in os.environ:
        monkeypatch.delenv(WORKSPACE_ENV)
    before = {sig: signal.signal(sig, _handler) for sig in (signal.SIGTERM, signal.SIGINT)}
    env = dict(os.environ)
    yield env
    for sig, handler in before.items():
        signal.signal(sig, handler)


def _assert_as_before(env: dict[str, str]) -> None:
    changed = {k for k in env.keys() | os.environ.keys() if env.get(k) != os.environ.get(k)}
    # pytest's own, and the cache folders Inductor names once per process (tests/conftest.py's KEPT_ENV)
    changed = {k for k in changed if not k.startswith(("PYTEST_", "TORCHINDUCTOR_", "TRITON_"))}
    assert WORKSPACE_ENV not in os.environ and not changed, changed
    assert signal.getsignal(signal.SIGTERM) is _handler and signal.getsignal(signal.SIGINT) is _handler
    assert [t.name for t in threading.enumerate() if t.name.startswith(OURS)] == []


def test_a_run_with_checkpoints_leaves_the_process_as_it_found_it(
    dataset, tmp_path, train_args, callers_state
) -> None:
    # asks for no cuBLAS workspace (the environment, as on torch 2.11); saves twice: the host pool's
    # reservation thread and the background writes run
    sets = ("steps=2", "checkpoint.every=1", "optimizations.gemm_workspace=zero")
    assert main(train_args(dataset, tmp_path / "run", *sets)) == 0
    assert (tmp_path / "run" / "checkpoints" / "step_000002").is_dir()
    _assert_as_before(callers_state)


def test_a_run_stopped_by_bad_data_leaves_the_process_as_it_found_it(
    nan_actions_copy, tmp_path, train_args, callers_state, capsys
) -> None:
    sets = ("steps=12", "optimizations.gemm_workspace=zero")
    assert main(train_args(nan_actions_copy, tmp_path / "run", *sets)) == 2
    assert "holds NaN/inf raw values" in capsys.readouterr().err
    _assert_as_before(callers_state)
