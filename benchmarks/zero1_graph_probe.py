"""How often gradients reduced inside a CUDA graph differ from eager at >1 GPU, per variant.

Each repetition builds the small model of tests/integration/_graph_overlap_check.py, runs one iteration (two
microbatches) with the sync captured, in both graph modes and with the collectives launched by the last
backward or by start() after it, and compares this rank's reduced gradients with the first eager run's, bit for
bit; each repetition also runs eager again, as the control.
Repetitions go round-robin over the variants, so whatever drifts with time on the machine (the failure rate
grew during a call on 2026-12-01) weighs on all of them alike. One process per GPU:

    torchrun --standalone --nproc-per-node 2 benchmarks/zero1_graph_probe.py --reps 20 \\
        --variants zero1,zero1-all-reduce,overlap,zero1-no-side-stream,zero1-grads-exposed

Variants: zero1 (DistributedAdamW, reduce-scatter), overlap (all-reduce, torch AdamW), zero1-all-reduce (an
in-place all-reduce of each bucket in place of the reduce-scatter: the shard holds the same sum),
zero1-no-side-stream (collectives issued from the capturing stream itself, without vla-overlap's side stream),
zero1-grads-exposed (each .grad set to its buffer view, not ZeRO-1's raising placeholder), zero1-synced (a
device synchronize after every iteration). Run the whole command with NCCL_GRAPH_REGISTER=0 to take NCCL's
registration of captured buffers out. `--device cpu` runs the same code with gloo and emulated graphs (a smoke
run: nothing can race there).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
from collections.abc import Iterator
from pathlib import Path

import torch
import torch.distributed as dist

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "integration"))
import _graph_overlap_check as check  # noqa: E402
import vla_overlap  # noqa: E402

VARIANTS = (
    "zero1",
    "overlap",
    "zero1-all-reduce",
    "zero1-no-side-stream",
    "zero1-grads-exposed",
    "zero1-synced",
)
_REDUCE_SCATTER = vla_overlap._comm.Communicator.reduce_scatter
_LAUNCH = vla_overlap._comm.CommStream.launch


@contextlib.contextmanager
def _on_current_stream(self: object) -> Iterator[None]:
    yield


def _apply(variant: str) -> str:
    """Set the knobs of `variant`; returns its comm mode."""
    comm = "overlap" if variant == "overlap" else "zero1_overlap"
    communicator, stream = vla_overlap._comm.Communicator, vla_overlap._comm.CommStream
    all_reduce = lambda self, out, inp: self.all_reduce(inp)  # noqa: E731
    communicator.reduce_scatter = all_reduce if variant == "zero1-all-reduce" else _REDUCE_SCATTER
    stream.launch = _on_current_stream if variant == "zero1-no-side-stream" else _LAUNCH
    check.EXPOSE_BUFFERS_AS_GRADS = variant == "zero1-grads-exposed"
    check.SYNC_AFTER_STEP = variant == "zero1-synced"
    return comm


def first_grads(variant: str, mode: str, launch: str, device: torch.device) -> torch.Tensor:
    check.STEPS = 1
    comm = _apply(variant)
    _, _, grads = check.train(mode, comm, device, launch)
    return grads


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--reps", type=int, default=20)
    p.add_argument("--variants", default="zero1,overlap", help=f"comma-separated, of {', '.join(VARIANTS)}")
    p.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    args = p.parse_args()
    variants = args.variants.split(",")
    unknown = sorted(set(variants) - set(VARIANTS))
    if unknown:
        p.error(f"unknown variants {unknown}; choose from {', '.join(VARIANTS)}")
    device = check.init(args.device)
    # eager again each round: the control (is it graphs that differ, or any run?)
    combos = [("eager", "backward")]
    combos += [(mode, launch) for mode in ("per_microbatch", "full_iteration") for launch in check.LAUNCHES]
    references = {v: first_grads(v, "eager", "backward", device) for v in variants}
    bad = {(v, c): 0 for v in variants for c in combos}
    for _ in range(args.reps):
        for variant in variants:
            for mode, launch in combos:
                same = torch.equal(first_grads(variant, mode, launch, device), references[variant])
                bad[(variant, (mode, launch))] += not same
    keys = sorted(bad)
    counts = torch.tensor([bad[k] for k in keys], device=device)
    dist.all_reduce(counts, op=dist.ReduceOp.MAX)  # the larger of the ranks' counts
    if dist.get_rank() == 0:
        register = os.environ.get("NCCL_GRAPH_REGISTER", "default")
        for (variant, (mode, launch)), count in zip(keys, counts.tolist()):
            print(f"{variant:>20} NCCL_GRAPH_REGISTER={register:<7} {mode:>15} launched by {launch:>8}: "
                  f"{count} of {args.reps} differ", flush=True)  # fmt: skip
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
