"""docs/architecture.md, "The packages and their boundaries": the three libraries stand alone, gr00t_model knows
no training code."""

from __future__ import annotations

import pytest
from _boundaries import PACKAGES, REPO, violations


@pytest.mark.parametrize("folder", sorted(PACKAGES))
def test_package_respects_boundaries(folder: str) -> None:
    module = PACKAGES[folder]
    src = REPO / "packages" / folder / "src" / module
    assert src.is_dir(), f"missing package source {src}"
    problems = violations(src, module)
    assert not problems, "package boundary broken:\n" + "\n".join(problems)


@pytest.mark.parametrize(
    ("module", "line", "expected"),
    [
        ("vla_io", "import gr00t_model\n", "must not import gr00t_model"),
        ("vla_overlap", "from vla_graph.x import y\n", "must not import vla_graph"),
        ("vla_graph", "import importlib\nimportlib.import_module('vla_io')\n", "must not import vla_io"),
        ("gr00t_model", "def f():\n    from gr00t_train import cli\n", "must not import gr00t_train"),
        ("vla_io", "EMBODIMENT = 3\n", "mentions 'embodiment'"),
    ],
)
def test_checker_catches_a_planted_violation(tmp_path, module: str, line: str, expected: str) -> None:
    # The checker itself must fail the day someone adds a forbidden import.
    (tmp_path / "planted.py").write_text(line)
    problems = violations(tmp_path, module)
    assert any(expected in p for p in problems), problems


def test_trainer_may_import_everything(tmp_path) -> None:
    (tmp_path / "ok.py").write_text("import vla_io, vla_overlap, vla_graph, gr00t_model\n")
    assert violations(tmp_path, "gr00t_train") == []
