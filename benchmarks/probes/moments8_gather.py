"""What a ZeRO-1 checkpoint save moves at two ranks with 8-bit AdamW moments, gathered as stored or decoded.

    python benchmarks/probes/moments8_gather.py [--steps 8] [--json OUT]      # CPU, 2 gloo processes

Two `gr00t-train train --preset demo` runs (the `tiny` model on a small synthetic LIBERO-like dataset, written to
a temporary folder) through torchrun at two processes on CPU, with `optimizations.comm=zero1_overlap`,
`memory.adam_moments=int8` and a checkpoint after every step:

- `encoded`: as gr00t-train saves: rank 0 gathers every rank's codes and block scales (`DistributedAdamW.
  state_dict(keep=..., encoded_moments=True)`) and the background writer decodes them.
- `decoded`: the same run with the moments decoded to fp32 before the gather (`encoded_moments` ignored: how a
  save at more than one rank worked before), inside the loop's stall.

Per save it reports the bytes the optimizer state's all-gathers received on each rank (counted around
`DistributedAdamW.state_dict`: masters and moments; the codes, scales and fp32 masters of the whole model), and
from summary.json the loop's stall (`checkpoint_stall_s`) and its `optimizer` part (the state dict and its
staging): all saves and their median. A CPU host-time measurement on a shared machine: the bytes are exact, the
seconds indicative.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

MODES = ("decoded", "encoded")


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=8, help="optimizer steps per run (one save after each)")
    p.add_argument("--json", type=Path, help="also write the report as JSON here")
    p.add_argument("--worker", choices=MODES, help=argparse.SUPPRESS)  # one rank of a run (under torchrun)
    p.add_argument("--out", type=Path, help=argparse.SUPPRESS)
    p.add_argument("cli", nargs="*", help=argparse.SUPPRESS)
    return p.parse_args(argv)


def worker(mode: str, out: Path, cli: list[str]) -> int:
    """One rank: counts the bytes every state dict's all-gathers receive, forces the decoded gather in mode
    `decoded`, then runs the CLI."""
    import torch.distributed as dist
    import vla_overlap
    from gr00t_train.cli import main
    from vla_overlap._comm import Communicator

    counts: list[dict[str, int]] = []  # per save: bytes received by the gathers of masters and of moments
    gather, state_dict = Communicator.all_gather, vla_overlap.DistributedAdamW.state_dict
    masters: set[int] = set()  # data pointers of the master shards while a state dict runs (else empty)

    def counting_gather(self, output, input):
        if masters:
            counts[-1]["masters" if input.data_ptr() in masters else "moments"] += output.nbytes
        return gather(self, output, input)

    def counted_state_dict(self, **kwargs):
        self._model.finish_param_sync()  # the parameters' own gather is not the save's
        if mode == "decoded":
            kwargs["encoded_moments"] = False
        counts.append({"masters": 0, "moments": 0})
        masters.update(m.data_ptr() for m in self.masters)
        try:
            return state_dict(self, **kwargs)
        finally:
            masters.clear()

    Communicator.all_gather = counting_gather
    vla_overlap.DistributedAdamW.state_dict = counted_state_dict
    code = main(cli)
    rank = dist.get_rank() if dist.is_initialized() else int(os.environ.get("RANK", "0"))
    (out / f"gathered-rank{rank}.json").write_text(json.dumps(counts))
    return code


def run(mode: str, dataset: Path, root: Path, steps: int) -> dict:
    out = root / mode
    out.mkdir(parents=True, exist_ok=True)
    sets = [f"data.dataset={dataset}", f"output_dir={out}", "device=cpu", f"steps={steps}", "data.batch_size=2",
            "data.num_workers=1", "optimizations.comm=zero1_overlap", "memory.adam_moments=int8",
            "checkpoint.every=1", "checkpoint.keep_last=1", "logging.progress=false", "logging.plots=false",
            "logging.tensorboard=false"]  # fmt: skip
    cli = ["train", "--preset", "demo"] + [a for s in sets for a in ("--set", s)]
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2", __file__,
           "--worker", mode, "--out", str(out), "--", *cli]  # fmt: skip
    print(f"{mode}: a 2-process run of {steps} steps, a save after each", flush=True)
    done = subprocess.run(cmd, env={**os.environ, "OMP_NUM_THREADS": "1"}, capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(
            f"{mode} run failed (exit {done.returncode}):\n{done.stdout[-3000:]}{done.stderr[-3000:]}"
        )
    summary = json.loads((out / "summary.json").read_text())
    gathered = [json.loads((out / f"gathered-rank{r}.json").read_text()) for r in (0, 1)]
    stall, parts = summary["checkpoint_stall_s"], summary["checkpoint_stall_parts_s"]
    optimizer = [p["optimizer"] for p in parts]
    last = gathered[0][-1]  # the same on both ranks and at every save
    return {
        "gathered_bytes_per_save": last["masters"] + last["moments"],
        "gathered_moment_bytes_per_save": last["moments"],
        "gathered_master_bytes_per_save": last["masters"],
        "gathered_bytes_all_saves_rank0": gathered[0],
        "gathered_bytes_all_saves_rank1": gathered[1],
        "stall_s": stall,
        "stall_median_s": statistics.median(stall),
        "stall_median_after_first_s": statistics.median(stall[1:]) if len(stall) > 1 else None,
        "optimizer_part_s": optimizer,
        "optimizer_part_median_s": statistics.median(optimizer),
        "checkpoint_bytes": summary["checkpoint_bytes"][-1] if summary["checkpoint_bytes"] else None,
    }


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    if args.worker:
        return worker(args.worker, args.out, args.cli)
    import vla_io

    with tempfile.TemporaryDirectory(prefix="moments8_gather_") as tmp:
        root = Path(tmp)
        dataset = root / "libero-like"
        vla_io.write_synthetic_dataset(
            dataset, vla_io.testing.SynthConfig(episodes=3, episode_length=24, image_size=64, codec="h264")
        )
        report = {mode: run(mode, dataset, root, args.steps) for mode in MODES}
    decoded, encoded = report["decoded"], report["encoded"]
    for what in ("gathered_bytes_per_save", "gathered_moment_bytes_per_save"):
        report[f"{what}_decoded_over_encoded"] = decoded[what] / encoded[what]
    print(f"{'':8s} {'gathered/save':>14s} {'of it moments':>14s} {'stall median':>13s} {'(after 1st)':>12s} "
          f"{'optimizer part':>15s}")  # fmt: skip
    for mode in MODES:
        r = report[mode]
        after = r["stall_median_after_first_s"]
        print(f"{mode:8s} {r['gathered_bytes_per_save']:>12,d} B {r['gathered_moment_bytes_per_save']:>12,d} B "
              f"{r['stall_median_s']:>11.4f} s {after if after is not None else float('nan'):>10.4f} s "
              f"{r['optimizer_part_median_s']:>13.4f} s")  # fmt: skip
    print(f"decoded / encoded: {report['gathered_bytes_per_save_decoded_over_encoded']:.3f}x the bytes per save, "
          f"{report['gathered_moment_bytes_per_save_decoded_over_encoded']:.3f}x the moments' bytes")  # fmt: skip
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(report, indent=2) + "\n")
        print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
