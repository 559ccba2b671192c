"""Command line: `python -m gr00t_model summary --preset n1.6-3b [--cameras 2 --image-size 256] [--json]`."""

from __future__ import annotations

import argparse
import json
import sys

from ._config import PRESETS, GR00TConfig


def _parse(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m gr00t_model", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    s = sub.add_parser("summary", help="parameter counts per component and training FLOPs per sample")
    s.add_argument("--preset", default="n1.6-3b", choices=PRESETS)
    s.add_argument("--cameras", type=int, default=1, help="images per sample (cameras x frames)")
    s.add_argument(
        "--image-size",
        type=int,
        nargs="+",
        metavar="PX",
        help="source image height [width]; rounded to the nearest multiple of 28 like the release (default: preset)",
    )
    s.add_argument(
        "--vlm-tokens", type=int, help="VL sequence length (default: 28 + 7 per image + image tokens)"
    )
    s.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="FIELD=VALUE",
        help="override a config field (JSON value)",
    )
    s.add_argument("--json", action="store_true", help="print JSON instead of a table")
    return parser.parse_args(argv)


def _config(args: argparse.Namespace) -> GR00TConfig:
    overrides = {}
    for item in args.set:
        key, sep, value = item.partition("=")
        if not sep:
            raise SystemExit(f"--set expects FIELD=VALUE, got {item!r}")
        try:
            overrides[key] = json.loads(value)
        except json.JSONDecodeError:
            overrides[key] = value
    return GR00TConfig.preset(args.preset, **overrides)


def _image_size(config: GR00TConfig, sizes: list[int] | None) -> tuple[int, int]:
    if not sizes:
        return config.image_size
    unit = config.vision_patch_size * config.downsample_factor
    height, width = sizes[0], sizes[-1]
    return tuple(max(unit, round(s / unit) * unit) for s in (height, width))


def main(argv: list[str] | None = None) -> int:
    """Entry point; returns the process exit code."""
    from ._flops import summary

    args = _parse(argv)
    config = _config(args)
    size = _image_size(config, args.image_size)
    report = summary(config, num_images=args.cameras, image_size=size, vlm_tokens=args.vlm_tokens)
    report = {"preset": args.preset, "cameras": args.cameras, "image_size": list(size), **report}
    if args.json:
        print(json.dumps(report, indent=2))
        return 0
    print(f"GR00T N1.6 preset {args.preset}: {args.cameras} camera(s) at {size[0]}x{size[1]}")
    print(f"{'component':<16}{'parameters':>16}")
    for name, count in report["parameters"].items():
        print(f"{name:<16}{count:>16,}")
    flops = report["flops"]
    print(f"\nVL tokens {int(flops['vlm_tokens'])}, DiT tokens {int(flops['dit_tokens'])}")
    print(f"{'FLOPs per sample':<24}{'GFLOP':>12}")
    for key in (
        "fwd_vision",
        "fwd_llm",
        "fwd_dit",
        "fwd_encoders",
        "fwd_total",
        "bwd_total",
        "train",
        "inference",
        "lm_head_avoided",
    ):
        print(f"{key:<24}{flops[key] / 1e9:>12.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
