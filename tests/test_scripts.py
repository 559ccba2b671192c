"""The repository's shell scripts: `source scripts/env.sh` must leave the caller's shell as it was."""

from __future__ import annotations

import subprocess

from _boundaries import REPO


def test_sourcing_env_sh_leaves_no_errexit_or_pipefail_behind() -> None:
    # `set -eo pipefail` at the top of a sourced script stays set in the caller's shell: the next failing
    # command there would close an interactive terminal.
    script = 'set +e +o pipefail; source scripts/env.sh >/dev/null || exit 9; echo "opts=$-"; set -o | grep pipefail; echo "venv=$VIRTUAL_ENV"; declare -F | grep -c _vla_env || true'
    out = subprocess.run(["bash", "-c", script], cwd=REPO, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-2000:]
    lines = out.stdout.splitlines()
    opts = next(line for line in lines if line.startswith("opts="))
    assert "e" not in opts.removeprefix("opts=")
    assert any(line.startswith("pipefail") and line.endswith("off") for line in lines)
    assert any(line.startswith("venv=") and len(line) > len("venv=") for line in lines)  # activated
    assert lines[-1] == "0"  # its helper function is gone too
