"""How often ZeRO-1's gradient reduce-scatter, captured in a CUDA graph, gives other shards than eager (issue 16).

Each repetition builds the small model of tests/integration/_graph_overlap_check.py, runs one iteration (two
microbatches) in a graph mode with the sync captured, and compares this rank's reduced gradient shard with the
eager one, bit for bit. One process per GPU:

    torchrun --standalone --nproc-per-node 2 benchmarks/zero1_graph_probe.py --reps 20 [--all-reduce]

--all-reduce replaces the reduce-scatter by an in-place all-reduce of the bucket (the shard then holds the
same sum): whether the difference belongs to the reduce-scatter. --sync-after-step waits for the device after
each iteration; --optimizer-on-default-stream builds DistributedAdamW (its parameter buffers) outside the
capture stream; --grads-exposed sets each .grad to its buffer view instead of ZeRO-1's raising placeholder.
Run with NCCL_GRAPH_REGISTER=0 to see whether NCCL's registration of captured buffers matters.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

import torch
import torch.distributed as dist

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "integration"))
import _graph_overlap_check as check  # noqa: E402
import vla_overlap  # noqa: E402


def first_shards(mode: str, launch: str, device: torch.device) -> torch.Tensor:
    check.STEPS = 1
    _, _, grads = check.train(mode, "zero1_overlap", device, launch)
    return grads


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--reps", type=int, default=20)
    p.add_argument("--all-reduce", action="store_true")
    p.add_argument("--sync-after-step", action="store_true")
    p.add_argument("--optimizer-on-default-stream", action="store_true")
    p.add_argument("--grads-exposed", action="store_true", help=".grad = buffer views, not placeholders")
    args = p.parse_args()
    check.EXPOSE_BUFFERS_AS_GRADS = args.grads_exposed
    check.SYNC_AFTER_STEP = args.sync_after_step
    check.OPTIMIZER_ON_CAPTURE_STREAM = not args.optimizer_on_default_stream
    device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", 0)))
    torch.cuda.set_device(device)
    dist.init_process_group("nccl", device_id=device)
    if args.all_reduce:
        vla_overlap._comm.Communicator.reduce_scatter = lambda self, out, inp: self.all_reduce(inp)
    reference = first_shards("eager", "backward", device)
    bad = {}
    for mode in ("per_microbatch", "full_iteration"):
        for launch in check.LAUNCHES:
            count = 0
            for _ in range(args.reps):
                count += not torch.equal(first_shards(mode, launch, device), reference)
            bad[(mode, launch)] = count
    flags = torch.tensor([bad[k] for k in sorted(bad)], device=device)
    dist.all_reduce(flags, op=dist.ReduceOp.MAX)
    if dist.get_rank() == 0:
        what = (
            ("all-reduce" if args.all_reduce else "reduce-scatter")
            + (" synced" if args.sync_after_step else "")
            + (" opt-on-default" if args.optimizer_on_default_stream else "")
            + (" grads-exposed" if args.grads_exposed else "")
        )
        register = os.environ.get("NCCL_GRAPH_REGISTER", "default")
        for key, count in zip(sorted(bad), flags.tolist()):
            print(f"{what:>30} NCCL_GRAPH_REGISTER={register:<7} {key[0]:>15} launched by {key[1]:>8}: "
                  f"{count} of {args.reps} differ", flush=True)  # fmt: skip
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
