"""The `gr00t-train` command line."""

from __future__ import annotations

import argparse
import importlib

from .__about__ import __version__

_PACKAGES = ("vla_io", "vla_overlap", "vla_graph", "gr00t_model", "gr00t_train")


def _demo(args: argparse.Namespace) -> int:
    # Until the trainer lands (issue 7) the demo only proves the five packages install and import together.
    for name in _PACKAGES:
        print(f"{name} {importlib.import_module(name).__version__}")
    print("The training demo arrives with the trainer; every package above is installed and importable.")
    return 0


def main(argv: list[str] | None = None) -> int:
    """Entry point of `gr00t-train`; returns the process exit code."""
    parser = argparse.ArgumentParser(prog="gr00t-train", description="Fast GR00T N1.6 fine-tuning")
    parser.add_argument("--version", action="version", version=f"gr00t-train {__version__}")
    commands = parser.add_subparsers(dest="command", required=True)
    commands.add_parser("demo", help="the README's main job").set_defaults(run=_demo)
    args = parser.parse_args(argv)
    return args.run(args)
