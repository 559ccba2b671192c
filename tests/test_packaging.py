"""Each package builds a wheel on its own and imports alone, without its siblings."""

from __future__ import annotations

import os
import subprocess
import sys
import sysconfig
import zipfile
from email.parser import Parser
from pathlib import Path

import pytest
from _boundaries import ALLOWED, PACKAGES, REPO
from packaging.requirements import Requirement

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def wheels(tmp_path_factory) -> dict[str, Path]:
    out = tmp_path_factory.mktemp("wheels")
    built = {}
    for folder in PACKAGES:
        subprocess.run(
            [
                sys.executable,
                "-m",
                "pip",
                "wheel",
                "-q",
                "--no-deps",
                "--no-build-isolation",
                "-w",
                str(out),
                str(REPO / "packages" / folder),
            ],
            check=True,
        )
        (wheel,) = out.glob(folder.replace("-", "_") + "-*.whl")
        built[folder] = wheel
    return built


def _metadata(wheel: Path):
    with zipfile.ZipFile(wheel) as zf:
        name = next(n for n in zf.namelist() if n.endswith(".dist-info/METADATA"))
        return Parser().parsestr(zf.read(name).decode())


@pytest.mark.parametrize("folder", sorted(PACKAGES))
def test_wheel_has_code_version_and_typed_marker(wheels, folder: str) -> None:
    module = PACKAGES[folder]
    about = (REPO / "packages" / folder / "src" / module / "__about__.py").read_text()
    meta = _metadata(wheels[folder])
    assert f'"{meta["Version"]}"' in about
    with zipfile.ZipFile(wheels[folder]) as zf:
        names = set(zf.namelist())
    assert f"{module}/__init__.py" in names and f"{module}/py.typed" in names


@pytest.mark.parametrize("folder", sorted(PACKAGES))
def test_wheel_depends_only_on_allowed_siblings(wheels, folder: str) -> None:
    requires = [Requirement(r) for r in _metadata(wheels[folder]).get_all("Requires-Dist") or []]
    siblings = [r for r in requires if r.name in PACKAGES]
    allowed = {f for f, m in PACKAGES.items() if m in ALLOWED[PACKAGES[folder]]}
    assert {r.name for r in siblings if r.marker is None} == allowed
    for req in siblings:
        assert "~=" in str(req.specifier), f"{folder}: sibling pin {req} must be compatible-release (~=)"


@pytest.mark.parametrize("folder", sorted(PACKAGES))
def test_wheel_installs_and_imports_alone(wheels, tmp_path, folder: str) -> None:
    """Install a wheel (plus the sibling wheels it may need) into an empty target and import it with only
    third-party site-packages on the path: the editable dev installs of the other packages stay invisible."""
    module = PACKAGES[folder]
    needed = [wheels[folder]] + [wheels[f] for f, m in PACKAGES.items() if m in ALLOWED[module]]
    target = tmp_path / "site"
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "install",
            "-q",
            "--no-deps",
            "--target",
            str(target),
            *map(str, needed),
        ],
        check=True,
    )
    invisible = [m for m in PACKAGES.values() if m != module and m not in ALLOWED[module]]
    paths = [str(target), sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"]]
    # -S skips site, so the .pth files of the editable dev installs are never read.
    code = (
        "import sys, importlib.util\n"
        f"sys.path[:0] = {paths!r}\n"
        f"import {module}\n"
        f"assert {module}.__file__.startswith({str(target)!r}), {module}.__file__\n"
        f"assert not [m for m in {invisible!r} if importlib.util.find_spec(m)]\n"
    )
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    subprocess.run([sys.executable, "-S", "-c", code], check=True, env=env)
