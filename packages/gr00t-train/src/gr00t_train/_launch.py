"""`gr00t-train launch`: torchrun for one or several nodes, with a bounded wait for the nodes and one line
per failure.

    gr00t-train launch --nnodes 2 --nproc-per-node 8 --rdzv-endpoint HOST:PORT [--join-timeout S] train ...

torchrun's own parser reads the options (every torchrun option works) and `torch.distributed.run.run` runs the
job in this process. What differs from plain torchrun: the rendezvous is c10d's (torchrun's default, static,
waits without a bound for a node that never starts); its join timeout is --join-timeout; the workers run
`python -m gr00t_train train ...`; a node missing when that time is up, or a worker that fails, ends the
command with one line instead of a traceback."""

from __future__ import annotations

import argparse
import re
import signal
from typing import Any

from ._errors import LaunchError

JOIN_TIMEOUT_S = 600
"""torchrun's own default: nodes of a large job can take minutes to start (image pulls, slow file systems)."""

USAGE = """\
gr00t-train launch [torchrun options] [--join-timeout SECONDS] train [train options]

one node, 8 GPUs:     gr00t-train launch --nproc-per-node 8 train --config run.yaml
two nodes (run the same command on both; HOST is the first node's address, reachable from the other):
                      gr00t-train launch --nnodes 2 --nproc-per-node 8 --rdzv-endpoint HOST:29400 train ..."""


DESCRIPTION = (
    "torchrun for gr00t-train: every rank runs `python -m gr00t_train train ...`; the nodes meet at a c10d "
    "rendezvous (--rdzv-endpoint, the first node's HOST:PORT) and give up after --join-timeout seconds when a "
    "node is missing (exit 2); a failed rank ends the job with one line naming it (and its exit code)."
)


def launch(argv: list[str]) -> int:
    """Run `gr00t-train train` under torchrun's agent as `argv` says; returns the exit code."""
    from torch.distributed import DistNetworkError, DistStoreError
    from torch.distributed import run as torchrun
    from torch.distributed.elastic.multiprocessing.api import SignalException
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.elastic.rendezvous.api import RendezvousConnectionError, RendezvousTimeoutError

    args, timeout = _parse(torchrun, argv)
    static = args.rdzv_backend == "static"
    try:
        torchrun.run(args)  # (sets a static rendezvous's default port)
    except (RendezvousTimeoutError, DistStoreError) as err:
        joined = re.search(r"(\d+)/(\d+) clients joined", str(err))  # the static store's count
        if isinstance(err, DistStoreError) and not (static and joined):
            raise
        endpoint = _endpoint(args)
        nodes = torchrun.parse_min_max_nnodes(args.nnodes)[0]
        who = f"only {joined[1]} of {joined[2]} nodes" if joined else f"fewer than {nodes} nodes"
        raise LaunchError(
            f"{who} joined the rendezvous at {endpoint} within {timeout} s (--join-timeout). Start the same "
            "command on every node (the same --nnodes and rendezvous address), check that "
            f"{endpoint} is reachable from each, or raise --join-timeout if nodes start slowly",
            2,
        ) from err
    except (RendezvousConnectionError, DistNetworkError) as err:
        raise LaunchError(
            f"cannot reach the rendezvous at {_endpoint(args)} ({_cause(err)}). It is the first node's address, the "
            "same on every node: start that node, or correct the address",
            2,
        ) from err
    except ChildFailedError as err:
        return _worker_failed(err)
    except SignalException as err:  # the launcher was stopped: the workers were asked to stop too
        return 128 + int(err.sigval)
    return 0


def _parse(torchrun: Any, argv: list[str]) -> tuple[argparse.Namespace, int]:
    """torchrun's options, the c10d rendezvous by default, the join timeout in --rdzv-conf, and the workers'
    command; returns the arguments and the join timeout in seconds."""
    parser = torchrun.get_args_parser()
    parser.prog, parser.usage = "gr00t-train launch", USAGE
    parser.description = DESCRIPTION
    parser.add_argument(
        "--join-timeout",
        type=int,
        metavar="SECONDS",
        help="how long a node waits for all --nnodes nodes at the rendezvous before it gives up (exit 2); "
        f"default {JOIN_TIMEOUT_S}, or join_timeout of --rdzv-conf",
    )
    for action in parser._actions:  # the positional torchrun calls training_script is the command here
        if action.dest == "training_script":
            action.metavar = "train"
            action.help = "the gr00t-train command every rank runs (its options follow)"
    parser.set_defaults(rdzv_backend="c10d")
    args = parser.parse_args(argv)
    if args.module or args.no_python or args.run_path:
        raise LaunchError("launch always runs `python -m gr00t_train`: drop -m, --no-python, --run-path", 2)
    if args.training_script != "train":
        raise LaunchError(f"launch runs `gr00t-train train` on every rank, not {args.training_script!r}", 2)
    args.module, args.training_script = True, "gr00t_train"
    args.training_script_args = ["train", *args.training_script_args]

    conf = dict(item.split("=", 1) for item in args.rdzv_conf.split(",") if "=" in item)
    timeout = args.join_timeout
    if timeout is None:
        timeout = int(conf.get("join_timeout", JOIN_TIMEOUT_S))
    if timeout <= 0:
        raise LaunchError(f"--join-timeout must be a positive number of seconds, got {timeout}", 2)
    conf["join_timeout"] = str(timeout)
    # Reaching the first node's store is bounded by read_timeout (60 s): a node started before it waits
    # the join timeout too.
    conf.setdefault("read_timeout", str(timeout))
    if args.rdzv_backend == "static":  # its only wait: the first node's store waiting for the others
        conf.setdefault("timeout", str(timeout))
    args.rdzv_conf = ",".join(f"{k}={v}" for k, v in conf.items())

    max_nodes = torchrun.parse_min_max_nnodes(args.nnodes)[1]
    if not args.standalone and args.rdzv_backend == "c10d" and not args.rdzv_endpoint:
        if max_nodes > 1:
            raise LaunchError(
                f"--nnodes {args.nnodes} needs --rdzv-endpoint HOST:PORT: the first node's address and a free "
                "port, the same on every node",
                2,
            )
        args.standalone = True  # one node: torchrun picks a free port itself
    return args, timeout


def _worker_failed(err: Any) -> int:
    """One line for the first rank that failed (its own output above says why), with that rank's exit code
    (1 when a signal killed it); ranks that all stopped on a signal after their checkpoint said so
    themselves: their exit code, no line."""
    failures = err.failures
    stopped = {128 + signal.SIGTERM, 128 + signal.SIGINT}
    if failures and all(f.exitcode in stopped for f in failures.values()):
        return max(f.exitcode for f in failures.values())
    rank, first = err.get_first_failure()
    if first.exitcode < 0:
        how = f"was killed by {first.signal_name()}"
    else:
        how = f"exited with code {first.exitcode}"
    raise LaunchError(
        f"rank {rank} (local rank {first.local_rank}, pid {first.pid}) {how} first; its own output above says "
        "why. The other ranks of this node were stopped",
        first.exitcode if first.exitcode > 0 else 1,
    ) from err


def _endpoint(args: argparse.Namespace) -> str:
    if args.rdzv_backend == "static" and not args.rdzv_endpoint:
        return f"{args.master_addr}:{args.master_port}"
    return "a free local port" if args.standalone else args.rdzv_endpoint


def _cause(err: BaseException) -> str:
    """The innermost reason of a rendezvous error (torchrun wraps the store's own error)."""
    while err.__cause__ is not None:
        err = err.__cause__
    return (str(err).strip().splitlines() or [type(err).__name__])[0].rstrip(".")
