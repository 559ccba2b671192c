"""GR00TN16.import_dependencies imports what building a model needs, so that a build after it imports nothing
more (what lets gr00t-train time the imports apart from the build), and the Triton attention op on request;
neither imports transformers' modeling code (10-15 s of a GPU host's start-up: the layers are our own). In a
fresh interpreter: the test session has imported everything already."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

_SCRIPT = r"""
import json, sys, torch
from gr00t_model import GR00TConfig, GR00TN16
from gr00t_model import _attention
triton = sys.argv[1] == "triton"
before = set(sys.modules)
GR00TN16.import_dependencies(triton_attention=triton)
imported = set(sys.modules)
GR00TN16(GR00TConfig.preset("tiny", triton_attention=triton))
print(json.dumps({
    "by_import": sorted(imported - before),
    "by_build": sorted(set(sys.modules) - imported),
    "transformers": sorted(m for m in sys.modules if m.startswith("transformers")),
    "op_loaded": _attention._OP is not None,
}))
"""


def _run(mode: str) -> dict:
    done = subprocess.run([sys.executable, "-c", _SCRIPT, mode], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_a_build_after_import_dependencies_imports_nothing_more() -> None:
    found = _run("plain")
    assert found["by_build"] == []
    assert found["transformers"] == []
    assert not found["op_loaded"]


def test_with_triton_attention_the_op_is_imported_too() -> None:
    pytest.importorskip("triton")
    found = _run("triton")
    assert found["op_loaded"] and "gr00t_model._attention_op" in found["by_import"]
    assert found["by_build"] == []
