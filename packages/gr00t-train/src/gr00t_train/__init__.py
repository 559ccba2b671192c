"""gr00t-train: see the package README."""

from .__about__ import __version__

__all__ = ["__version__"]
