"""Lazy exports, so that importing `vla_io` or one of its subpackages stays cheap: a public name is imported
from its module on first use (numpy, pyarrow and torch load only then).

A package's `__init__` lists its names in `__all__` and where they live in a dict, then installs the
module-level `__getattr__` and `__dir__` made here.
"""

from __future__ import annotations

import importlib
import sys
import warnings
from collections.abc import Callable, Iterable, Mapping
from typing import Any


def lazy_exports(
    package: str,
    exports: Mapping[str, str],
    *,
    subpackages: Iterable[str] = (),
    moved: Mapping[str, str] | None = None,
    removal: str = "",
) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """(`__getattr__`, `__dir__`) for `package`.

    `exports`: public name -> module (relative to `package`) that defines it. `subpackages`: names of
    subpackages that attribute access imports (`vla_io.testing` works after `import vla_io`). `moved`:
    names that left this package's API for another module; they still resolve there, with a
    DeprecationWarning that names the new place and the release (`removal`) that drops the old one.
    """
    subpackages = tuple(subpackages)
    moved = dict(moved or {})

    def __getattr__(name: str) -> Any:
        module = sys.modules[package]
        if name in exports:
            value = getattr(importlib.import_module(exports[name], package), name)
            setattr(module, name, value)  # later lookups find it without calling this function
            return value
        if name in subpackages:
            return importlib.import_module(f".{name}", package)  # the import sets the attribute
        if name in moved:
            home = importlib.import_module(moved[name], package)
            warnings.warn(
                f"{package}.{name} moved to {home.__name__}.{name}; the old name goes away in {removal}",
                DeprecationWarning,
                stacklevel=2,
            )
            return getattr(home, name)
        raise AttributeError(f"module {package!r} has no attribute {name!r}")

    def __dir__() -> list[str]:
        return sorted({*sys.modules[package].__all__, *subpackages})

    return __getattr__, __dir__
