"""The `vla-io` command line: `synth` writes a synthetic dataset, `info` summarizes one, `check` decodes all of
one and lists every bad file, episode and frame, `cache` builds a decoded-frame cache, `ffmpeg-libs` makes
PyAV's bundled FFmpeg loadable by torchcodec."""

from __future__ import annotations

import argparse
import logging
import sys

from .__about__ import __version__


def _synth(args: argparse.Namespace) -> int:
    from .testing.synth import SYNTH_PRESETS, write_synthetic_dataset

    changes = {
        name: value
        for name, value in {
            "version": args.version, "codec": args.codec, "episodes": args.episodes,
            "episode_length": args.length, "image_size": args.image_size, "fps": args.fps, "seed": args.seed,
            "video_file_size_mb": args.video_file_size_mb, "data_file_size_mb": args.data_file_size_mb,
            "pool_episodes": args.pool_episodes,
        }.items()
        if value is not None
    }  # fmt: skip
    if args.cameras:
        changes.update(_camera_options(args.cameras))
    for flag, field in (("no_modality", "modality"), ("no_stats", "stats")):
        if getattr(args, flag):
            changes[field] = False
    if args.grouped_names:
        changes["grouped_names"] = True
    config = SYNTH_PRESETS[args.preset].with_(**changes)
    root = write_synthetic_dataset(args.path, config, overwrite=args.overwrite, workers=args.workers)
    print(
        f"wrote {config.episodes} episodes ({sum(config.lengths())} frames, {config.version}, {config.codec}) to {root}"
    )
    return 0


def _camera_options(text: str) -> dict:
    """ "front=96x128,wrist=64x64" (or plain names) -> SynthConfig fields."""
    names, sizes = [], []
    for item in text.split(","):
        name, _, size = item.strip().partition("=")
        names.append(name)
        if size:
            try:
                height, width = (int(v) for v in size.lower().split("x"))
            except ValueError:
                raise ValueError(f"--cameras: {item!r} is not NAME=HEIGHTxWIDTH") from None
            sizes.append((height, width))
    if sizes and len(sizes) != len(names):
        raise ValueError(f"--cameras: give a size for every camera or for none, got {text!r}")
    return {"cameras": tuple(names), **({"camera_sizes": tuple(sizes)} if sizes else {})}


def _info(args: argparse.Namespace) -> int:
    from .dataset.info import describe

    print(describe(args.path))
    return 0


def _check(args: argparse.Namespace) -> int:
    from .decode.check import check_dataset

    report = check_dataset(
        args.path, workers=args.workers, progress=not args.no_progress, video_backend=args.backend
    )
    print(report.table())
    return 0 if report.ok else 1


def _cache(args: argparse.Namespace) -> int:
    from .dataset.lerobot import LeRobotDataset
    from .decode.frame_cache import FrameCache

    dataset = LeRobotDataset(args.path, image_dtype="uint8")
    cache = FrameCache.build(dataset, size=tuple(args.size) if args.size else None, directory=args.dir)
    print(f"cached {len(dataset)} frames of {cache.keys} at {cache.size} in {cache.directory}")
    return 0


def _ffmpeg_libs(args: argparse.Namespace) -> int:
    from .decode.ffmpeg import link_pyav_ffmpeg

    out = link_pyav_ffmpeg(args.dir).resolve()
    print(f"linked PyAV's FFmpeg libraries in {out}; start Python with:\nexport LD_LIBRARY_PATH={out}")
    return 0


def build_parser() -> argparse.ArgumentParser:
    """The argument parser (separate for tests and docs)."""
    from .testing.synth import CODECS, SYNTH_PRESETS, VERSIONS

    parser = argparse.ArgumentParser(prog="vla-io", description="LeRobot dataset tools")
    parser.add_argument("--version", action="version", version=f"vla-io {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)
    synth = sub.add_parser("synth", help="write a synthetic dataset with real encoded mp4 files")
    synth.add_argument("path")
    synth.add_argument("--preset", choices=sorted(SYNTH_PRESETS), default="libero")
    synth.add_argument("--version", dest="version", choices=VERSIONS, help="LeRobot layout (default v2.1)")
    synth.add_argument("--codec", choices=CODECS, help="video codec (default av1)")
    synth.add_argument("--episodes", type=int)
    synth.add_argument("--length", type=int, help="frames of the longest episode")
    synth.add_argument(
        "--image-size", type=int, help="camera height and width (>= 64; 64 for fast CPU demos)"
    )
    synth.add_argument("--fps", type=int)
    synth.add_argument("--seed", type=int)
    synth.add_argument(
        "--cameras", help="camera names, optionally with sizes: front=480x640,wrist=256x256 (HEIGHTxWIDTH)"
    )
    synth.add_argument("--no-modality", action="store_true", help="no meta/modality.json (plain LeRobot)")
    synth.add_argument("--no-stats", action="store_true", help="no statistics files (stats.json etc.)")
    synth.add_argument(
        "--grouped-names", action="store_true", help="state/action `names` as named groups of joints"
    )
    synth.add_argument(
        "--video-file-size-mb",
        type=float,
        help="v3.0: roll each camera's video file over at this many MiB, as LeRobot does (its default: 200); "
        "the frames are copied from --pool-episodes encoded episodes",
    )
    synth.add_argument(
        "--data-file-size-mb",
        type=float,
        help="with --video-file-size-mb: data file limit in MiB (default 100)",
    )
    synth.add_argument(
        "--pool-episodes", type=int, help="with --video-file-size-mb: distinct encoded episodes (default 16)"
    )
    synth.add_argument(
        "--workers", type=int, help="with --video-file-size-mb: processes (default: one per CPU core)"
    )
    synth.add_argument("--overwrite", action="store_true")
    synth.set_defaults(run=_synth)
    info = sub.add_parser("info", help="print a dataset summary")
    info.add_argument("path")
    info.set_defaults(run=_info)
    check = sub.add_parser(
        "check", help="decode every frame and read every row; list every bad file, episode and frame"
    )
    check.add_argument("path")
    check.add_argument("--workers", type=int, help="parallel processes (default: one per CPU core)")
    check.add_argument("--backend", choices=("auto", "torchcodec", "pyav"), default="auto")
    check.add_argument("--no-progress", action="store_true", help="no progress bar")
    check.set_defaults(run=_check)
    cache = sub.add_parser("cache", help="decode all frames once into a memory-mapped cache")
    cache.add_argument("path")
    cache.add_argument("--size", type=int, nargs=2, metavar=("H", "W"), help="resize to this (training) size")
    cache.add_argument(
        "--dir", help="cache directory (default: in the user cache folder, see vla_io.user_cache_dir)"
    )
    cache.set_defaults(run=_cache)
    libs = sub.add_parser(
        "ffmpeg-libs", help="link PyAV's bundled FFmpeg under standard names for torchcodec (LD_LIBRARY_PATH)"
    )
    libs.add_argument("dir", help="directory for the links (created)")
    libs.set_defaults(run=_ffmpeg_libs)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Entry point of `vla-io`; returns the process exit code."""
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    try:
        return args.run(args)
    except (OSError, ValueError, KeyError) as err:
        print(f"vla-io {args.command}: error: {err}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
