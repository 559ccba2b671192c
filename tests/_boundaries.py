"""The package boundary rule (docs/architecture.md, "The packages and their boundaries"), as data and a checker shared
by tests."""

from __future__ import annotations

import ast
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PACKAGES = {
    "vla-io": "vla_io",
    "vla-overlap": "vla_overlap",
    "vla-graph": "vla_graph",
    "gr00t-model": "gr00t_model",
    "gr00t-train": "gr00t_train",
}
OURS = set(PACKAGES.values())
LIBRARIES = {"vla_io", "vla_overlap", "vla_graph"}
# What each package may import from this repository (besides itself).
ALLOWED = {
    "vla_io": set(),
    "vla_overlap": set(),
    "vla_graph": set(),
    "gr00t_model": set(),
    "gr00t_train": {"vla_io", "vla_overlap", "vla_graph", "gr00t_model"},
}
# Words that betray knowledge of GR00T inside a generic library.
GR00T_WORDS = ("gr00t", "groot", "eagle", "embodiment", "action_head")


def imported_modules(source: str, filename: str) -> list[tuple[int, str]]:
    """Top-level names of every absolute import in a module, with line numbers."""
    found = []
    for node in ast.walk(ast.parse(source, filename)):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name.split(".")[0]) for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found.append((node.lineno, node.module.split(".")[0]))
        elif isinstance(node, ast.Call) and _is_dynamic_import(node):
            found.append((node.lineno, node.args[0].value.split(".")[0]))
    return found


def _is_dynamic_import(node: ast.Call) -> bool:
    """importlib.import_module("x") or __import__("x") with a literal name."""
    func = node.func
    name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
    return (
        name in ("import_module", "__import__")
        and bool(node.args)
        and isinstance(node.args[0], ast.Constant)
        and isinstance(node.args[0].value, str)
    )


def violations(src_root: Path, module: str) -> list[str]:
    """Every forbidden import (and, for libraries, GR00T vocabulary) under one package's source."""
    forbidden = OURS - ALLOWED[module] - {module}
    problems = []
    for path in sorted(src_root.rglob("*.py")):
        text = path.read_text()
        rel = path.relative_to(REPO) if path.is_relative_to(REPO) else path
        for line, name in imported_modules(text, str(path)):
            if name in forbidden:
                problems.append(f"{rel}:{line}: {module} must not import {name}")
        if module in LIBRARIES:
            for number, content in enumerate(text.splitlines(), 1):
                lowered = content.lower()
                problems += [
                    f"{rel}:{number}: generic library {module} mentions {word!r}"
                    for word in GR00T_WORDS
                    if word in lowered
                ]
    return problems
