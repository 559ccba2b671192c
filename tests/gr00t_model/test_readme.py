"""The package README's quick start runs as written (with its output folder moved to a temporary directory)."""

from __future__ import annotations

import re
from pathlib import Path

README = Path(__file__).resolve().parents[2] / "packages" / "gr00t-model" / "README.md"


def test_quick_start_runs(tmp_path) -> None:
    code = re.search(r"```python\n(.*?)```", README.read_text(), re.S).group(1)
    namespace: dict = {}
    exec(
        compile(code.replace("checkpoints/gr00t-tiny", str(tmp_path / "ckpt")), str(README), "exec"),
        namespace,
    )
    assert namespace["raw_actions"].shape == (4, 16, 7)
    assert namespace["actions"].shape == (4, 16, 64)
    assert (tmp_path / "ckpt" / "model.safetensors").exists()
