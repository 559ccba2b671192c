"""The `gr00t-train` command line: train, demo, infer, export, bench, config."""

from __future__ import annotations

import argparse
import errno
import json
import logging
import os
import signal
import sys
import time
from pathlib import Path

from .__about__ import __version__
from ._errors import (
    BatchTooLargeError,
    CheckpointError,
    ConfigError,
    DataError,
    LaunchError,
    NonFiniteLossError,
    NonFiniteWeightsError,
    PeerLostError,
    TrainingInterrupted,
)
from ._signals import StoppedAtOnce, loop_began, stop_watching, watch_start_up


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
    from .config.io import load_config

    overrides = list(args.overrides)
    if getattr(args, "resume", None):
        overrides.append(f"checkpoint.resume={args.resume}")
    if getattr(args, "resume_changed", None):
        overrides.append(f"checkpoint.resume_changed={','.join(args.resume_changed)}")
    if getattr(args, "existing_run", None):
        overrides.append(f"checkpoint.existing_run={args.existing_run}")
    return load_config(args.config, preset=args.preset, overrides=overrides)


def _train(args: argparse.Namespace) -> int:
    from ._run import run_training

    cfg = _resolve(args)
    args.resolved = cfg  # main's error messages look at its checkpoint folder
    if not cfg.data.dataset and not cfg.data.mixture:
        raise ConfigError(
            "data.dataset",
            "no dataset given; pass --set data.dataset=PATH (a LeRobot dataset), or data.mixture in a config file",
        )
    summary = run_training(cfg)
    if summary is not None:
        print(summary.table())
        print(f"outputs: {cfg.output_dir} (metrics.jsonl, summary.json, loss.png, step_time.png)")
        print(f"checkpoints: {cfg.checkpoint_dir}")
        report = Path(cfg.output_dir) / "summary.json"
        if report.is_file():  # the rest of the job's end is the interpreter's exit (time_to_model.py splits it)
            logging.getLogger("gr00t_train").info(
                "run over %.2f s after summary.json was written (plots, the run's release, the process group)",
                time.time() - report.stat().st_mtime,
            )
    return 0


def _demo(args: argparse.Namespace) -> int:
    from ._cli_demo import run_demo

    dataset = Path(args.dataset) if args.dataset else None
    return run_demo(Path(args.out), dataset, list(args.overrides))


def _infer(args: argparse.Namespace) -> int:
    from .validation.infer import evaluate

    report = evaluate(
        args.checkpoint, args.dataset, batches=args.batches, batch_size=args.batch_size, device=args.device
    )
    print(f"checkpoint {report.checkpoint}, dataset {report.dataset}: {report.samples} samples")
    print(report.table())
    if args.json:
        Path(args.json).write_text(json.dumps(report.as_dict(), indent=2) + "\n")
    return 0


def _export(args: argparse.Namespace) -> int:
    from .checkpoint.export import export

    out = export(args.checkpoint, args.out, lora_only=args.lora_only)
    if args.lora_only:
        print(
            f"exported the LoRA adapters of {args.checkpoint} to {out} (gr00t_model.load_lora puts them on the base)"
        )
    else:
        print(
            f"exported {args.checkpoint} to {out} (loads with gr00t_model.from_pretrained; infer --checkpoint {out})"
        )
    return 0


def _bench(args: argparse.Namespace) -> int:
    from ._bench import format_table, run_ladder, write_json

    args.overrides = ["checkpoint.existing_run=overwrite", *args.overrides]  # rows are throwaway runs
    cfg = _resolve(args)
    if not cfg.data.dataset and not cfg.data.mixture:
        raise ConfigError("data.dataset", "no dataset given; pass --set data.dataset=PATH (or data.mixture)")
    rows = [int(r) for r in args.rows.split(",")] if args.rows else None
    if args.baseline_runs < 1:
        raise ConfigError("--baseline-runs", f"must be >= 1, got {args.baseline_runs}")
    result = run_ladder(
        cfg, steps=args.steps, warmup=args.warmup, rows=rows, baseline_runs=args.baseline_runs
    )
    print(format_table(result))
    if args.json:
        write_json(result, args.json)
        print(f"wrote {args.json}")
    return 0


def _config(args: argparse.Namespace) -> int:
    from .config.docs import commented_yaml
    from .config.io import config_to_dict

    cfg = _resolve(args)
    if args.format == "json":
        print(json.dumps(config_to_dict(cfg), indent=2))
    else:
        print(commented_yaml(cfg), end="")
    return 0


TRAIN_HELP = """\
Fine-tune GR00T N1.6 on a LeRobot dataset (v2.0, v2.1 or v3.0; read only, never written to).

The settings to set first (each as --set KEY=VALUE, or in a --config file; `gr00t-train config` prints all
of them with their docs):
  data.dataset=PATH          the LeRobot dataset folder (required)
  data.cameras=a,b           which cameras feed the model, in order (default: every camera)
  data.embodiment_tag=TAG    the robot's projector slot: new_embodiment for a robot the release has not seen
  model.checkpoint=DIR       the initial weights: a local copy of the release (nvidia/GR00T-N1.6-3B) or one
                             of our checkpoints (default: random weights, with a warning on the 3 B model)
  model.tokenizer=DIR        the tokenizer those weights were trained with (the release's Qwen3 tokenizer)
  steps=N                    optimizer steps (default 10000), data.batch_size=N per GPU (default 16)
  output_dir=DIR             logs, plots, validation, checkpoints and the compile cache (default
                             runs/gr00t-train)

State and action joint groups come from the dataset's meta/modality.json (GR00T's format), else from its
observation.state and action features (a feature whose `names` is a dict of lists is split into those
groups); data.modality_file points at a modality.json kept outside the dataset. Every speed switch is on
where the hardware supports it (the start-up log says what is on, and why anything is off)."""

TRAIN_EXAMPLES = """\
examples:
  gr00t-train train --set data.dataset=/data/my_robot --set data.cameras=front,wrist \\
      --set model.checkpoint=/models/GR00T-N1.6-3B --set model.tokenizer=/models/gr00t-tokenizer
  gr00t-train train --config run.yaml --resume              # continue the exact trajectory
  gr00t-train launch --nproc-per-node 8 train --config run.yaml      # 8 GPUs (torchrun)"""


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of `gr00t-train` (exposed for tests and docs)."""
    parser = argparse.ArgumentParser(prog="gr00t-train", description="Fast GR00T N1.6 fine-tuning")
    parser.add_argument("--version", action="version", version=f"gr00t-train {__version__}")
    parser.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    commands = parser.add_subparsers(dest="command", required=True)

    train = commands.add_parser(
        "train",
        help="fine-tune on a LeRobot dataset (works under torchrun)",
        description=TRAIN_HELP,
        epilog=TRAIN_EXAMPLES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    _add_config_args(train)
    train.add_argument(
        "--resume",
        nargs="?",
        const="auto",
        metavar="CHECKPOINT",
        help="continue from a checkpoint folder (default: the newest intact one in checkpoint.dir)",
    )
    train.add_argument(
        "--resume-changed",
        action="append",
        metavar="KEY",
        help="with --resume: allow this setting (e.g. optim.lr) to differ from the checkpoint's; the change "
        "is logged and recorded (repeat for several)",
    )
    previous = train.add_mutually_exclusive_group()
    previous.add_argument(
        "--new-run",
        dest="existing_run",
        action="store_const",
        const="new_run",
        help="output_dir holds another run: move it to <output_dir>/previous-runs/<run id>/ and start afresh",
    )
    previous.add_argument(
        "--overwrite",
        dest="existing_run",
        action="store_const",
        const="overwrite",
        help="output_dir holds another run: delete its checkpoints and logs and start afresh",
    )
    train.set_defaults(run=_train)

    demo = commands.add_parser(
        "demo", help="train the tiny model on a synthetic dataset, then infer (CPU or GPU)"
    )
    demo.add_argument("--out", default="runs/demo", help="where the dataset, logs and checkpoints go")
    demo.add_argument("--dataset", help="use this LeRobot dataset instead of writing the synthetic one")
    demo.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE")
    demo.set_defaults(run=_demo)

    infer = commands.add_parser("infer", help="open-loop eval: predicted vs recorded action chunks")
    infer.add_argument("--checkpoint", required=True, help="a checkpoint folder (or a folder of them)")
    infer.add_argument("--dataset", required=True, help="a LeRobot dataset")
    infer.add_argument("--batches", type=int, default=8, help="batches to evaluate (a seeded sample)")
    infer.add_argument("--batch-size", type=int, default=8)
    infer.add_argument("--device", default="auto", choices=("auto", "cpu", "cuda"))
    infer.add_argument("--json", metavar="PATH", help="also write the report as JSON")
    infer.set_defaults(run=_infer)

    export = commands.add_parser(
        "export",
        help="a checkpoint as a complete model folder (gr00t_model.from_pretrained loads it alone)",
        description="Checkpoints hold only what training changed (frozen weights stay in the base the run "
        "started from; trainable ones in the optimizer state). export rebuilds the whole model and writes it "
        "with dataset_meta/ and train_config.json, for infer and for sharing.",
    )
    export.add_argument("checkpoint", help="a checkpoint folder (or a folder of them: the newest intact one)")
    export.add_argument("out", help="the folder to write (must not exist, or be empty)")
    export.add_argument(
        "--lora-only",
        action="store_true",
        help="write only the LoRA adapters (adapter_config.json + adapter.safetensors, MBs) instead of the whole "
        "model with them merged into its weights",
    )
    export.set_defaults(run=_export)

    bench = commands.add_parser(
        "bench", help="the ablation ladder: baseline -> + async data -> + overlap -> ..."
    )
    _add_config_args(bench)
    bench.add_argument("--steps", type=int, default=20, help="measured steps per row")
    bench.add_argument("--warmup", type=int, default=6, help="steps per row before measuring (capture etc.)")
    bench.add_argument("--rows", help="comma-separated row indices to run (default: all)")
    bench.add_argument("--baseline-runs", type=int, default=1,
                       help="run the first row this many times and report the median (it is host-bound)")  # fmt: skip
    bench.add_argument("--json", metavar="PATH", help="also write the results as JSON")
    bench.set_defaults(run=_bench)

    launch = commands.add_parser(
        "launch",
        help="torchrun for one or several nodes: `gr00t-train launch --help` (a missing node fails within "
        "--join-timeout)",
        add_help=False,
    )
    launch.add_argument("torchrun_args", nargs=argparse.REMAINDER)

    config = commands.add_parser("config", help="print the resolved config (a template for --config)")
    _add_config_args(config)
    config.add_argument("--format", choices=("yaml", "json"), default="yaml")
    config.set_defaults(run=_config)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Entry point of `gr00t-train`; returns the process exit code."""
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv[:1] == ["launch"]:  # torchrun's own options follow: its parser reads them, not this one
        from ._launch import launch

        return _run_command(argparse.Namespace(command="launch", run=lambda _: launch(argv[1:])))
    args = build_parser().parse_args(argv)
    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        datefmt="%H:%M:%S",
    )
    previous = watch_start_up()
    try:
        return _run_command(args)
    finally:
        stop_watching(previous)


def _run_command(args: argparse.Namespace) -> int:
    """The command, its errors turned into one line and an exit code."""
    try:
        return args.run(args)
    except (ConfigError, DataError) as err:  # bad input: nothing ran
        _say(args, f"error: {err}", same_on_every_rank=isinstance(err, ConfigError))
        return 2
    except PeerLostError as err:  # another rank died: one surviving rank per node says so
        if err.speaks:
            _say(args, f"error: {err}")
        return 1
    except (NonFiniteLossError, NonFiniteWeightsError, BatchTooLargeError, CheckpointError) as err:
        _say(args, f"error: {err}")  # training stopped; the message says why
        return 1
    except LaunchError as err:  # a node missing at the rendezvous (2), a failed worker (1)
        _say(args, f"error: {err}")
        return err.exit_code
    except TrainingInterrupted as err:  # SIGTERM / SIGINT after a checkpoint: the conventional 128 + signal
        _say(args, f"stopped by {err}", same_on_every_rank=True)
        return 128 + signal.Signals[err.signal_name].value
    except KeyboardInterrupt as err:  # Ctrl-C before the loop took over SIGINT, or twice during it
        if isinstance(err, StoppedAtOnce) or loop_began():
            hint = _resume_hint(args)
            _say(
                args,
                "stopped at once by Ctrl-C: the step in progress was not saved"
                + (f";{hint}" if hint else ""),
            )
        else:
            _say(args, "interrupted during start-up; nothing to save")
        return 130
    except OSError as err:
        if err.errno not in (errno.ENOSPC, errno.EDQUOT):
            raise
        # A failed write() names no file; the run's folder is where it was writing.
        cfg = getattr(args, "resolved", None)
        folder = cfg.output_dir if cfg is not None else None
        where = f" writing {err.filename}" if err.filename else (f" writing in {folder}" if folder else "")
        name = errno.errorcode[err.errno]
        _say(
            args,
            f"error: {err.strerror} ({name}){where}; free space, then" + (_resume_hint(args) or " run again"),
        )
        return 1


def _resume_hint(args: argparse.Namespace) -> str:
    """` continue with --resume` when the run has a checkpoint to continue from, else ``."""
    cfg = getattr(args, "resolved", None)
    if cfg is None:
        return ""
    from .checkpoint.checkpointer import Checkpointer

    try:
        has_checkpoint = Checkpointer(cfg.checkpoint_dir, keep_last=1).latest() is not None
    except OSError:
        has_checkpoint = False
    return " continue with --resume" if has_checkpoint else ""


def _say(args: argparse.Namespace, text: str, same_on_every_rank: bool = False) -> None:
    """One line on stderr. Under torchrun, rank 0 speaks for errors every rank hits alike (config, an agreed
    stop); other ranks prefix theirs with the rank, as their log lines are."""
    rank = int(os.environ.get("RANK", "0"))
    if rank != 0 and same_on_every_rank:
        return
    prefix = f"[rank {rank}] " if rank else ""
    print(f"{prefix}gr00t-train {args.command}: {text}", file=sys.stderr)


if __name__ == "__main__":
    sys.exit(main())
