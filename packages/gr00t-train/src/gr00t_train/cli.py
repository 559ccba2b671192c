"""The `gr00t-train` command line: train, demo, infer, bench, config."""

from __future__ import annotations

import argparse
import json
import logging
import sys

from .__about__ import __version__
from ._errors import ConfigError, DataError


def _add_config_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--config", metavar="FILE", help="a .toml, .yaml or .json config file")
    parser.add_argument("--preset", help="start from a named preset: demo or libero")
    parser.add_argument(
        "--set",
        dest="overrides",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="override one setting, e.g. --set optim.lr=3e-4 --set optimizations.graph=per_microbatch",
    )


def _resolve(args: argparse.Namespace):
    from ._config_io import load_config

    overrides = list(args.overrides)
    if getattr(args, "resume", None):
        overrides.append(f"checkpoint.resume={args.resume}")
    return load_config(args.config, preset=args.preset, overrides=overrides)


def _train(args: argparse.Namespace) -> int:
    from ._run import run_training

    cfg = _resolve(args)
    if not cfg.data.dataset:
        raise ConfigError(
            "data.dataset", "no dataset given; pass --set data.dataset=PATH (a LeRobot dataset)"
        )
    summary = run_training(cfg)
    if summary is not None:
        print(summary.table())
        print(f"outputs: {cfg.output_dir} (metrics.jsonl, summary.json, loss.png, step_time.png)")
        print(f"checkpoints: {cfg.checkpoint_dir}")
    return 0


def _config(args: argparse.Namespace) -> int:
    from ._config_io import config_to_dict

    data = config_to_dict(_resolve(args))
    if args.format == "json":
        print(json.dumps(data, indent=2))
    else:
        import yaml

        print(yaml.safe_dump(data, sort_keys=False), end="")
    return 0


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of `gr00t-train` (exposed for tests and docs)."""
    parser = argparse.ArgumentParser(prog="gr00t-train", description="Fast GR00T N1.6 fine-tuning")
    parser.add_argument("--version", action="version", version=f"gr00t-train {__version__}")
    parser.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    commands = parser.add_subparsers(dest="command", required=True)

    train = commands.add_parser("train", help="fine-tune on a LeRobot dataset (works under torchrun)")
    _add_config_args(train)
    train.add_argument(
        "--resume",
        nargs="?",
        const="auto",
        metavar="CHECKPOINT",
        help="continue from a checkpoint folder (default: the newest in checkpoint.dir)",
    )
    train.set_defaults(run=_train)

    config = commands.add_parser("config", help="print the resolved config (a template for --config)")
    _add_config_args(config)
    config.add_argument("--format", choices=("yaml", "json"), default="yaml")
    config.set_defaults(run=_config)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Entry point of `gr00t-train`; returns the process exit code."""
    args = build_parser().parse_args(argv)
    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        datefmt="%H:%M:%S",
    )
    try:
        return args.run(args)
    except (ConfigError, DataError) as err:
        print(f"gr00t-train {args.command}: error: {err}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
