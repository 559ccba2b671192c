"""Every package README's Python code runs as written: all ```python blocks of a README, in order, as one
script (what a user's `python example.py` would hold), on CPU, in a folder holding the synthetic dataset
that the vla-io README's own `vla-io synth data/demo ...` line writes. The five scripts run in one fresh
interpreter (one start-up instead of five), each from its own folder, then the interpreter exits: it must
exit 0 without an abort (a Pipeline left open at exit once aborted it) and leave the dataset untouched."""

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
_DRIVER = """
import os, runpy, sys, traceback
for folder, script in {scripts!r}:
    os.chdir(os.path.dirname(script))
    print(f"=== {{folder}}", flush=True)
    try:
        runpy.run_path(script, run_name="__main__")
    except BaseException:
        traceback.print_exc()
        print(f"=== FAILED {{folder}}", flush=True)
        sys.exit(1)
    print(f"=== OK {{folder}}", flush=True)
"""


def _readme(folder: str) -> str:
    return (REPO / "packages" / folder / "README.md").read_text()


def _blocks(text: str) -> list[str]:
    return re.findall(r"^```python\n(.*?)^```", text, re.S | re.M)


def _demo_data(base: Path) -> Path:
    """data/demo under `base`, as the vla-io README's setup line writes it (that line is run, verbatim)."""
    from vla_io.cli import main

    (line,) = SYNTH.findall(_readme("vla-io"))
    cwd = Path.cwd()
    os.chdir(base)
    try:
        assert main(shlex.split(line)[1:]) == 0
    finally:
        os.chdir(cwd)
    return base / "data" / "demo"


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_every_readme_python_block_runs_verbatim(tmp_path) -> None:
    data = _demo_data(tmp_path)
    scripts = []
    for folder in sorted(PACKAGES):
        text = _readme(folder)
        blocks = _blocks(text)
        assert blocks, f"packages/{folder}/README.md has no python example"
        script = "\n\n".join(blocks)
        if "data/demo" in script:  # the README says how to make the dataset it reads
            assert "vla-io synth data/demo" in text, (
                f"{folder}: the README reads data/demo but never makes it"
            )
        work = tmp_path / folder
        (work / "data").mkdir(parents=True)
        (work / "data" / "demo").symlink_to(data)
        (work / "readme_example.py").write_text(script)
        scripts.append((folder, str(work / "readme_example.py")))
    driver = tmp_path / "driver.py"
    driver.write_text(_DRIVER.format(scripts=scripts))
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK")}
    env.update(OMP_NUM_THREADS="1", CUDA_VISIBLE_DEVICES="")
    with read_only(data):
        done = subprocess.run(
            [sys.executable, str(driver)], env=env, capture_output=True, text=True, timeout=550
        )
    report = f"{done.stdout[-3000:]}\n{done.stderr[-5000:]}"
    assert done.returncode == 0, report
    assert [line[7:] for line in done.stdout.splitlines() if line.startswith("=== OK ")] == sorted(PACKAGES)
    assert "terminate called" not in done.stderr
