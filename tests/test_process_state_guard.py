"""The suite's guard beyond torch's switches (tests/conftest.py): a test that leaves the environment, a
SIGTERM/SIGINT handler, autocast or one of our threads behind fails, and the next test starts clean. An
in-process training run left CUBLAS_WORKSPACE_CONFIG set for every later test and subprocess."""

from __future__ import annotations

import shutil
import subprocess
import sys

from _boundaries import REPO

LEAKY = """
import os
import signal
import threading

import torch

def test_leaves_a_variable_set():
    os.environ["GUARD_PROBE_VARIABLE"] = "1"

def test_sees_it_gone():
    assert "GUARD_PROBE_VARIABLE" not in os.environ

def test_a_library_may_set_its_cache_folder():
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = os.environ.get("TORCHINDUCTOR_CACHE_DIR", "/tmp/probe-cache")

def test_leaves_a_sigterm_handler():
    signal.signal(signal.SIGTERM, lambda signum, frame: None)

def test_sees_the_default_sigterm_handler():
    assert signal.getsignal(signal.SIGTERM) == signal.SIG_DFL

def test_leaves_autocast_on():
    torch.set_autocast_enabled("cpu", True)

def test_sees_autocast_off():
    assert not torch.is_autocast_enabled("cpu")

stop = threading.Event()

def test_leaves_a_thread_of_ours_running():
    threading.Thread(target=stop.wait, name="gr00t-train-probe", daemon=True).start()

def test_a_thread_that_ends_soon_after_is_no_leak():
    stop.set()  # the one above ends now; this one ends within the guard's grace
    threading.Thread(target=stop.wait, args=(0.3,), name="gr00t-train-late", daemon=True).start()
"""


def test_a_test_that_leaves_process_state_changed_fails(tmp_path) -> None:
    shutil.copy(REPO / "tests" / "conftest.py", tmp_path / "conftest.py")
    (tmp_path / "test_leaky.py").write_text(LEAKY)
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:randomly", str(tmp_path)]
    out = subprocess.run(cmd, cwd=tmp_path, capture_output=True, text=True, timeout=300)
    report = out.stdout[-5000:]
    assert out.returncode == 1, report
    errors = {line.split("::")[1].split()[0] for line in out.stdout.splitlines() if line.startswith("ERROR ")}
    assert errors == {
        "test_leaves_a_variable_set",
        "test_leaves_a_sigterm_handler",
        "test_leaves_autocast_on",
        "test_leaves_a_thread_of_ours_running",
    }, report
    assert "9 passed, 4 errors" in out.stdout, report  # every later test saw the state restored
    text = out.stdout
    assert "left os.environ changed" in text and "'GUARD_PROBE_VARIABLE': (None, '1')" in text, report
    assert "left signal handlers changed" in text and "left global torch state changed" in text, report
    assert "left threads running: ['gr00t-train-probe']" in text, report
