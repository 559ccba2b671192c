"""Every package README's Python code runs as written: all ```python blocks of a README, in order, as one
script in a fresh interpreter (a user's `python example.py`), on CPU, in a folder holding the synthetic
dataset that the README's own `vla-io synth data/demo ...` line writes. The run must exit 0 without an
abort (a Pipeline left open at exit once aborted the interpreter) and leave the dataset untouched."""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
from _boundaries import PACKAGES, REPO
from _readonly import read_only

SYNTH = re.compile(r"^vla-io synth data/demo .*$", re.M)


def _readme(folder: str) -> str:
    return (REPO / "packages" / folder / "README.md").read_text()


def _blocks(text: str) -> list[str]:
    return re.findall(r"^```python\n(.*?)^```", text, re.S | re.M)


@pytest.fixture(scope="module")
def demo_data(tmp_path_factory) -> Path:
    """data/demo as the vla-io README's setup line writes it (that line is run here, verbatim)."""
    from vla_io.cli import main

    (line,) = SYNTH.findall(_readme("vla-io"))
    base = tmp_path_factory.mktemp("readme-data")
    cwd = Path.cwd()
    os.chdir(base)
    try:
        assert main(shlex.split(line)[1:]) == 0
    finally:
        os.chdir(cwd)
    return base / "data" / "demo"


@pytest.mark.slow
@pytest.mark.timeout(300)
@pytest.mark.parametrize("folder", sorted(PACKAGES))
def test_readme_python_runs_verbatim(folder, demo_data, tmp_path) -> None:
    text = _readme(folder)
    blocks = _blocks(text)
    assert blocks, f"packages/{folder}/README.md has no python example"
    script = "\n\n".join(blocks)
    if "data/demo" in script:  # the README must say how to make the dataset it reads
        assert SYNTH.search(text) or "vla-io README" in text, f"{folder}: README reads data/demo but never makes it"
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "demo").symlink_to(demo_data)
    path = tmp_path / "readme_example.py"
    path.write_text(script)
    env = {**os.environ, "OMP_NUM_THREADS": "1", "CUDA_VISIBLE_DEVICES": ""}
    env.pop("RANK", None), env.pop("WORLD_SIZE", None)
    with read_only(demo_data):
        done = subprocess.run(
            [sys.executable, str(path)], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=280
        )
    assert done.returncode == 0, f"{folder} README:\n{done.stdout[-2000:]}\n{done.stderr[-4000:]}"
    assert "terminate called" not in done.stderr
