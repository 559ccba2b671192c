"""The `vla-io` command line."""

from __future__ import annotations

import argparse

from .__about__ import __version__


def main(argv: list[str] | None = None) -> int:
    """Entry point of `vla-io`; returns the process exit code."""
    parser = argparse.ArgumentParser(prog="vla-io", description="LeRobot dataset tools")
    parser.add_argument("--version", action="version", version=f"vla-io {__version__}")
    parser.parse_args(argv)
    parser.print_help()
    return 0
