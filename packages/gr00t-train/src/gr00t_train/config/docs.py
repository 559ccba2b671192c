"""Each setting's documentation, read from the config classes' field docstrings (the string literal under a
field), so `gr00t-train config` prints a template whose every setting carries its doc as a comment."""

from __future__ import annotations

import ast
import dataclasses
import functools
import inspect
import textwrap
from typing import Any

from .types import field_types

WIDTH = 110


@functools.cache
def field_docs(cls: type) -> dict[str, str]:
    """{field name: its docstring, whitespace collapsed} of a dataclass (fields without one are left out)."""
    tree = ast.parse(textwrap.dedent(inspect.getsource(cls)))
    body = tree.body[0].body  # the class statement's body
    docs = {}
    for node, after in zip(body, body[1:]):
        is_doc = isinstance(after, ast.Expr) and isinstance(getattr(after, "value", None), ast.Constant)
        is_field = isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name)
        if is_field and is_doc and isinstance(after.value.value, str):
            docs[node.target.id] = " ".join(after.value.value.split())
    return docs


def first_sentence(doc: str) -> str:
    """The doc up to its first full stop outside parentheses (not an `e.g.`): a doc's own summary line."""
    depth = 0
    for i, char in enumerate(doc):
        depth += {"(": 1, ")": -1}.get(char, 0)
        if (
            char == "."
            and depth == 0
            and doc[i + 1 : i + 2] in ("", " ")
            and not doc[:i].endswith(("e.g", "i.e"))
        ):
            return doc[: i + 1]
    return doc


def commented_yaml(cfg: Any) -> str:
    """`cfg` as YAML, each setting under a comment with the first sentence of its doc (full docs:
    `gr00t-train config --help` points to the package README)."""
    return "\n".join(_lines(cfg, indent="")) + "\n"


def _lines(section: Any, indent: str) -> list[str]:
    import yaml

    out: list[str] = []
    docs = field_docs(type(section))
    for name, hint in field_types(type(section)).items():
        value = getattr(section, name)
        if dataclasses.is_dataclass(hint):
            doc = (inspect.getdoc(hint) or "").split("\n\n")[0]
            out += ["", *_comment(" ".join(doc.split()), indent), f"{indent}{name}:"]
            out += _lines(value, indent + "  ")
            continue
        out += _comment(first_sentence(docs.get(name, "")), indent)
        plain = list(value) if isinstance(value, tuple) else value
        text = yaml.safe_dump({name: plain}, default_flow_style=True, sort_keys=False, width=10**6)
        out.append(indent + text.strip().removeprefix("{").removesuffix("}"))
    return out


def _comment(text: str, indent: str) -> list[str]:
    if not text:
        return []
    return [f"{indent}# {line}" for line in textwrap.wrap(text, WIDTH - len(indent) - 2)]
