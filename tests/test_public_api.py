"""The public API of each package is its `__all__`; a committed snapshot makes every change deliberate.

When you add or remove a public name, update tests/<import_name>/public_api.txt and the package's
CHANGELOG.md (and bump the version where the change breaks users)."""

from __future__ import annotations

import importlib

import pytest
from _boundaries import PACKAGES, REPO


@pytest.mark.parametrize("module", sorted(PACKAGES.values()))
def test_public_api_matches_snapshot(module: str) -> None:
    package = importlib.import_module(module)
    exported = sorted(package.__all__)
    missing = [name for name in exported if not hasattr(package, name)]
    assert not missing, f"{module}.__all__ lists names it does not define: {missing}"
    snapshot = REPO / "tests" / module / "public_api.txt"
    expected = sorted(line.strip() for line in snapshot.read_text().splitlines() if line.strip())
    assert exported == expected, (
        f"{module}.__all__ changed; update {snapshot.relative_to(REPO)} and the CHANGELOG"
    )


@pytest.mark.parametrize("folder", sorted(PACKAGES))
def test_version_comes_from_about(folder: str) -> None:
    module = PACKAGES[folder]
    about = (REPO / "packages" / folder / "src" / module / "__about__.py").read_text()
    assert f'__version__ = "{importlib.import_module(module).__version__}"' in about
