"""The suite's own guard: a test that changes a process-wide torch switch and leaves it fails (tests/conftest.py).
A TF32 flag left on by one test once made a later GPU-vs-CPU comparison fail."""

from __future__ import annotations

import shutil
import subprocess
import sys

from _boundaries import REPO

LEAKY = """
import torch

def test_leaves_tf32_on():
    torch.backends.cuda.matmul.allow_tf32 = True

def test_restores_what_it_changed():
    torch.backends.cudnn.benchmark = True
    torch.backends.cudnn.benchmark = False

def test_sees_a_clean_state():
    assert torch.backends.cuda.matmul.allow_tf32 is False
"""


def test_a_test_that_leaves_a_torch_switch_changed_fails(tmp_path) -> None:
    shutil.copy(REPO / "tests" / "conftest.py", tmp_path / "conftest.py")
    (tmp_path / "test_leaky.py").write_text(LEAKY)
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:randomly", str(tmp_path)]
    out = subprocess.run(cmd, cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert out.returncode == 1, out.stdout[-3000:]
    assert "1 passed, 2 passed" not in out.stdout
    assert "3 passed, 1 error" in out.stdout  # the leak is an error of that test; the next one starts clean
    assert "ERROR test_leaky.py::test_leaves_tf32_on" in out.stdout
    assert (
        "left global torch state changed" in out.stdout
        and "'cuda.matmul.allow_tf32': (False, True)" in out.stdout
    )
