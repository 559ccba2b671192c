"""The README's example runs as documented (two processes under torchrun, gloo on CPU)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

README = Path(__file__).resolve().parents[2] / "packages" / "vla-overlap" / "README.md"


def test_readme_example_trains_under_torchrun(tmp_path) -> None:
    example = re.findall(r"```python\n(.*?)```", README.read_text(), re.S)[0]
    script = tmp_path / "example.py"
    script.write_text(example)
    env = dict(os.environ, OMP_NUM_THREADS="1", CUDA_VISIBLE_DEVICES="")
    command = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",  # torchrun binds a free port itself: no race with other jobs for a probed one
        "--nproc-per-node",
        "2",
    ]
    done = subprocess.run([*command, str(script)], env=env, capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, done.stderr[-3000:]
    lines = [line for line in done.stdout.splitlines() if line.startswith("step ")]
    assert len(lines) == 10 and lines[-1].startswith("step 9 loss ")
