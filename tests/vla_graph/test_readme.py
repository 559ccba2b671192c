"""The README's example must keep running as written."""

from __future__ import annotations

import re
from pathlib import Path

README = Path(__file__).resolve().parents[2] / "packages" / "vla-graph" / "README.md"


def test_readme_example_runs(capsys) -> None:
    code = re.search(r"```python\n(.*?)```", README.read_text(), re.S).group(1)
    namespace: dict = {}
    exec(compile(code, str(README), "exec"), namespace)
    step = namespace["step"]
    assert step.report.replays == 5 and step.report.captures == 1
    assert "GraphReport(" in capsys.readouterr().out
    assert all(loss.shape == () for loss in namespace["losses"])
