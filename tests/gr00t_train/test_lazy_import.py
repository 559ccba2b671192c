"""`import gr00t_train` and its command line load no torch: the CLI is up in a fraction of a second, so a
Ctrl-C during start-up lands in `main()` (one line, exit 130) instead of a traceback from inside an import."""

from __future__ import annotations

import subprocess
import sys

import gr00t_train


def test_importing_the_package_and_its_cli_loads_no_torch() -> None:
    code = "import sys, gr00t_train, gr00t_train.cli; print(sorted(m for m in ('torch', 'vla_io', 'gr00t_model') if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_every_public_name_resolves() -> None:
    for name in gr00t_train.__all__:
        assert getattr(gr00t_train, name) is not None, name
    assert sorted(dir(gr00t_train)) == sorted(gr00t_train.__all__)


def test_private_modules_resolve_as_attributes() -> None:
    code = "import gr00t_train; print(gr00t_train._run.__name__)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "gr00t_train._run"
