"""The repository's shell scripts: `source scripts/env.sh` must leave the caller's shell as it was."""

from __future__ import annotations

import importlib.util
import os
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest
from _boundaries import PACKAGES, REPO


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


def _clone(dest: Path) -> Path:
    """The parts of this checkout env.sh installs from: the five packages and env.sh itself, as they are on
    disk (a `git clone` would miss uncommitted work). Each clone's vla_io says which clone it is."""
    shutil.copytree(
        REPO / "packages",
        dest / "packages",
        ignore=shutil.ignore_patterns("__pycache__", "*.egg-info", ".pytest_cache", ".ruff_cache"),
    )
    (dest / "scripts").mkdir()
    shutil.copy2(REPO / "scripts" / "env.sh", dest / "scripts" / "env.sh")
    (dest / "packages" / "vla-io" / "src" / "vla_io" / "_clone.py").write_text(f"NAME = {dest.name!r}\n")
    return dest


def test_a_venv_shared_by_two_clones_runs_the_code_of_the_clone_that_sources_env_sh(tmp_path) -> None:
    # Editable installs point at one checkout: with one VLA_VENV for clones a and b, b's scripts would run a's
    # code, and fail once a is deleted. Offline and without a torch install: the test venv sees this
    # environment's site-packages, less the five packages, through a .pth file (this environment stays as it is).
    for module in ("hatchling", "editables"):
        if importlib.util.find_spec(module) is None:
            pytest.skip(f"{module} is not importable here: scripts/env.sh installs it")
    site = Path(sysconfig.get_paths()["purelib"])
    before = sorted(os.listdir(site))
    deps = tmp_path / "deps"
    deps.mkdir()
    for entry in site.iterdir():
        name = entry.name.lower()
        ours = name.split("-")[0].split(".")[0] in PACKAGES.values()
        if not ours and not name.startswith(("_editable_impl_", "__editable__")):
            (deps / entry.name).symlink_to(entry)
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    pyver = f"python{sys.version_info.major}.{sys.version_info.minor}"
    (venv / "lib" / pyver / "site-packages" / "deps.pth").write_text(f"{deps}\n")
    a, b = _clone(tmp_path / "a"), _clone(tmp_path / "b")
    # The install stamp named as env.sh names it, so that it skips its first-run install (torch, network).
    cksum = subprocess.run(
        ["bash", "-c", "cat packages/*/pyproject.toml scripts/env.sh | cksum | cut -d' ' -f1"],
        cwd=a,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    (venv / f".vla-installed-{cksum}").touch()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PIP_", "VIRTUAL_ENV", "PYTHONPATH"))}
    env.update(VLA_VENV=str(venv), PYTHON=sys.executable, PIP_NO_INDEX="1", PIP_CONFIG_FILE=os.devnull)
    show = (
        "import importlib.util, vla_io._clone; print('clone', vla_io._clone.NAME);"
        f"[print('from', importlib.util.find_spec(m).origin) for m in {sorted(PACKAGES.values())}]"
    )

    def source(clone: Path, moved_from: str | None) -> None:
        out = subprocess.run(
            ["bash", "-c", f'source scripts/env.sh || exit 9; python -c "{show}"'],
            cwd=clone,
            env=env,
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-2000:]
        lines = out.stdout.splitlines()
        assert f"clone {clone.name}" in lines, out.stdout
        origins = [line.removeprefix("from ") for line in lines if line.startswith("from ")]
        assert len(origins) == 5 and all(o.startswith(f"{clone}/packages/") for o in origins), origins
        said = [line for line in lines if line.startswith("[env]")]
        if moved_from is None:
            assert said == [], said  # nothing to do: quiet
        else:
            assert said == [
                f"[env] the environment's packages point at {moved_from}; installing this checkout's ({clone}) into it"
            ]

    try:
        source(a, moved_from="nothing (vla-io is not installed)")
        source(b, moved_from=str(a))
        source(a, moved_from=str(b))
        shutil.rmtree(a)
        source(b, moved_from=f"{a} (deleted)")
        source(b, moved_from=None)
        assert sorted(os.listdir(site)) == before
    finally:
        for path in (a, b, venv, deps):  # deps holds symlinks only: rmtree unlinks them, their targets stay
            shutil.rmtree(path, ignore_errors=True)


def test_step_timeline_reads_one_step_between_side_stream_starts(tmp_path) -> None:
    # benchmarks/step_timeline.py on a made-up trace: three steps of 100 us; each has an update on the side
    # stream (tid 2) at its start, then on the compute stream (tid 1) a memset, a 2 us gap, a GEMM, a 1 us gap
    # and a Triton kernel.
    import gzip
    import json
    import sys

    sys.path.insert(0, str(REPO / "benchmarks"))
    try:
        import step_timeline
    finally:
        sys.path.pop(0)
    events = []
    for step in range(4):
        t = step * 5000.0
        events += [
            {"ph": "X", "cat": "kernel", "name": "_adamw_blocks_kernel", "tid": 2, "ts": t, "dur": 30.0},
            {"ph": "X", "cat": "gpu_memset", "name": "Memset (Device)", "tid": 1, "ts": t + 40, "dur": 1.0},
            {"ph": "X", "cat": "kernel", "name": "nvjet_sm90_gemm", "tid": 1, "ts": t + 43, "dur": 20.0},
            {"ph": "X", "cat": "kernel", "name": "triton_poi_add", "tid": 1, "ts": t + 64, "dur": 5.0},
        ]
    path = tmp_path / "trace.json.gz"
    with gzip.open(path, "wt") as f:
        json.dump({"traceEvents": events}, f)
    loaded = step_timeline.load(path)
    start, stop = step_timeline.step_window(loaded, main=1)
    assert (start, stop) == (5000.0, 10000.0)
    found = step_timeline.summarize(loaded, start, stop, main=1, top=3)
    assert found["busy_ms_by_stream"] == {"1": 0.03, "2": 0.03}
    assert found["compute_stream"]["kernels"] == 3
    assert found["by_family"]["memset"] == {"kernels": 1, "ms": 0.0, "gaps_after_ms": 0.0}  # 2 us rounds to 0
    assert found["top_with_gaps"][0] == ["nvjet_sm90_gemm", 1, 0.021]  # 20 us and the 1 us gap after it
    assert step_timeline.bins(loaded, start, stop, main=1, width_ms=0.05) == [
        {"from_ms": 0.0, "compute_ms": 0.021, "other_ms": 0.03, "kernels": 2},  # update, memset, GEMM
        {"from_ms": 0.05, "compute_ms": 0.005, "other_ms": 0.0, "kernels": 1},  # the Triton kernel at 64 us
        *(
            {"from_ms": round(i * 0.05, 3), "compute_ms": 0.0, "other_ms": 0.0, "kernels": 0}
            for i in range(2, 101)
        ),
    ]
    listed = step_timeline.kernel_list(loaded, start, stop, main=1)
    assert [(at, us, gap) for at, us, gap, _ in listed] == [
        (0.04, 1.0, 0.0),
        (0.043, 20.0, 2.0),
        (0.064, 5.0, 1.0),
    ]
