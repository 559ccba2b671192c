"""The training loop's stall when a checkpoint of n1.6-3b's size is staged (target: <= 1 s per save, one H200).

    source benchmarks/gpu_env.sh && python benchmarks/probes/checkpoint_stall.py [--json OUT]

A DistributedAdamW at one rank over NCCL steps `--params` trainable bf16 elements (fp32 masters and two fp32
moments: 19.4 GB at n1.6-3b's 1.62 B; the flat Triton step) on vla_overlap's update stream, as gr00t-train
runs it. Each step also runs matmuls standing for n1.6-3b's forward and backward: `--frozen-ms` before it
waits for the update (the frozen prefix) and the rest of `--step-ms` after (60 ms: batch 16 at ~270
samples/s). A save stages the optimizer state as gr00t-train's CheckpointComponent does (the weights' finite
check, `state_dict(on_device=True)`, `Staging` with its pool reserved beforehand for the save's tensors as
placed, `--frozen-gb` of frozen bf16 weights copied as a run from random weights writes them): in mode `host-copies` the
host copies read the live state and the next update waits for them; in `device-snapshot` the state is first
copied on the device. Per save it prints the host time of the save call (what summary.json's
checkpoint_stall_s records), when its copies ended, and the loop's stall: the wall time of `--window` steps
starting with the save, less the median of the same steps without one; then how long the first update after
each save waited on the device for its copies (summary.json's checkpoint_update_wait_s). The synchronous CPU state dict (what
a save cost before staging) and the pool's reservation (done in the background by a run) are timed too.

The first save of each mode is reported on its own line (`first`): it allocates the snapshot buffer that later
saves reuse. Each save's host time is split into parts as summary.json's checkpoint_stall_parts_s splits it
(wait for the update, the finite check, the state dict, the staging of the state and of the frozen weights,
with the staging's own parts: pool wait and growth, snapshot allocation and copies, host copies), with the
device memory before and after it (summary.json's checkpoint_memory_gib).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn.functional as F
from gr00t_train._run_checks import check_weights_finite
from gr00t_train.checkpoint.async_save import StallClock
from gr00t_train.checkpoint.host_pool import nbytes
from gr00t_train.checkpoint.staging import Staging, device_room, expected_bytes, expected_sizes
from torch import nn
from vla_overlap import DistributedAdamW, OverlapConfig, OverlapDataParallel, UpdateStream

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the shared helpers in benchmarks/
from _cuda_timing import cuda_ms  # noqa: E402


def parse() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--params", type=float, default=1.62e9, help="trainable elements (n1.6-3b: 1.62e9)")
    p.add_argument("--layers", type=int, default=48)
    p.add_argument("--step-ms", type=float, default=60.0, help="the step's forward and backward, emulated")
    p.add_argument("--frozen-ms", type=float, default=20.0, help="of which before waiting for the update")
    p.add_argument("--window", type=int, default=16, help="steps timed from a save on")
    p.add_argument("--saves", type=int, default=3, help="saves per mode")
    p.add_argument(
        "--frozen-gb", type=float, default=2.7, help="frozen bf16 weights a save copies (n1.6-3b: 2.7)"
    )
    p.add_argument("--json", type=Path)
    return p.parse_args()


class Loop:
    """The model, its optimizer on the update stream, and a step of emulated work around a tiny forward."""

    def __init__(self, args: argparse.Namespace) -> None:
        width = max(64, round((args.params / args.layers) ** 0.5 / 64) * 64)
        torch.manual_seed(0)
        layers = [nn.Linear(width, width, bias=False) for _ in range(args.layers)]
        self.module = nn.Sequential(*layers).to("cuda", torch.bfloat16)
        self.model = OverlapDataParallel(self.module, OverlapConfig())
        self.opt = DistributedAdamW(self.model, lr=1e-5, weight_decay=0.01, flat="auto")
        self.updates = UpdateStream("cuda")
        self.x = torch.randn(16, width, device="cuda", dtype=torch.bfloat16)
        self.a = torch.randn(4096, 4096, device="cuda", dtype=torch.bfloat16)
        mm_ms = cuda_ms(lambda: self.a @ self.a)
        self.frozen = max(0, round(args.frozen_ms / mm_ms))
        self.trainable = max(0, round((args.step_ms - args.frozen_ms) / mm_ms))
        self.elements = sum(p.numel() for p in self.module.parameters())
        count = max(
            0, round(args.frozen_gb * 1e9 / (64 << 20))
        )  # 64 MiB tensors, as the run's frozen weights
        self.frozen_weights = {f"frozen{i}": torch.zeros(32 << 20, device="cuda", dtype=torch.bfloat16)
                               for i in range(count)}  # fmt: skip

    def step(self) -> None:
        for _ in range(self.frozen):  # reads no trainable weight: beside the previous update
            self.a @ self.a
        self.updates.wait()
        self.opt.zero_grad()
        for _ in range(self.trainable):
            self.a @ self.a
        F.mse_loss(self.model(self.x).float(), self.x.float()).backward()
        with self.updates.side():
            self.opt.clip_grad_norm_(1.0)
            self.opt.step()

    def window(self, steps: int, save=None) -> tuple[float, dict]:
        """Wall seconds of `steps` steps (to the device's end), `save` after the first; its report."""
        torch.cuda.synchronize()
        started, report = time.perf_counter(), {}
        for i in range(steps):
            self.step()
            if i == 0 and save is not None:
                report = save()
        torch.cuda.synchronize()
        if report.get("thread") is not None:
            report.pop("thread").join()
        return time.perf_counter() - started, report


def saver(loop: Loop, staging: Staging):
    """A save as CheckpointComponent.save stages it (without the files): returns its report."""

    def save() -> dict:
        clock = StallClock()
        loop.updates.wait()  # Trainer.save: wait_for_update
        clock.lap("wait_update")
        check_weights_finite(loop.module, 0)
        clock.lap("finite_check")
        room = device_room(staging.device)
        staging.begin()
        state = loop.opt.state_dict(on_device=True, encoded_moments=True)
        clock.lap("state_dict")
        staged = {key: staging.copy(value, guarded=key == "state") for key, value in state.items()}
        clock.lap("optimizer")
        staging.copy(loop.frozen_weights)
        ready = staging.finish()
        clock.lap("frozen_weights")
        report = {"host_s": clock.total(), "device_room_gb": room / 1e9,
                  "parts_s": {**clock.laps, "staging": dict(staging.parts)}, "memory_gib": staging.memory}  # fmt: skip

        def wait() -> None:
            ready()
            report["copied_s"] = time.perf_counter() - clock.started
            report["entries"] = sum(len(entry) for entry in staged["state"].values())

        report["thread"] = threading.Thread(target=wait)
        report["thread"].start()
        report.update(snapshot_gb=staging.snapshot_bytes / 1e9, update_waits=staging._pending is not None)
        return report

    return save


def _rounded(value):
    if isinstance(value, dict):
        return {k: _rounded(v) for k, v in value.items()}
    return round(value, 4) if isinstance(value, float) else value


def main() -> None:
    args = parse()
    with tempfile.TemporaryDirectory() as store:
        dist.init_process_group("nccl", init_method=f"file://{store}/pg", rank=0, world_size=1)
        torch.cuda.set_device(0)
        loop = Loop(args)
        for _ in range(3):  # compile the flat step, allocate the moments
            loop.step()
        state_gb = expected_bytes(loop.opt) / 1e9
        print(
            f"{loop.elements / 1e9:.2f} B trainable elements, {state_gb:.1f} GB of optimizer state",
            flush=True,
        )
        base = statistics.median(loop.window(args.window)[0] for _ in range(3))
        loop.updates.wait()
        torch.cuda.synchronize()
        started = time.perf_counter()
        loop.opt.state_dict()
        cpu_s = time.perf_counter() - started
        print(f"{args.window} steps: {base:.3f} s without a save; the CPU state dict takes {cpu_s:.2f} s")
        result = {"args": vars(args) | {"json": None}, "state_gb": state_gb, "window_s": base,
                  "state_dict_cpu_s": cpu_s, "modes": {}}  # fmt: skip
        for mode, device_copies in (("host-copies", False), ("device-snapshot", True)):
            staging = Staging(torch.device("cuda"), device_copies=device_copies)
            hook = loop.opt.register_step_pre_hook(staging.before_update)  # as CheckpointComponent does
            started = time.perf_counter()
            frozen = [nbytes(t.shape, t.dtype) for t in loop.frozen_weights.values()]
            staging.pool.reserve_for([4096] * 4 + expected_sizes(loop.opt) + frozen)  # as a run reserves it
            reserve_s = time.perf_counter() - started
            rows = []
            for index in range(args.saves):
                wall, report = loop.window(args.window, saver(loop, staging))
                rows.append(report | {"stall_s": wall - base, "grown_gb": staging.pool.grown / 1e9,
                                      "first": index == 0})  # fmt: skip
                print(json.dumps({"mode": mode} | _rounded(rows[-1])), flush=True)
            result["modes"][mode] = {"reserve_s": reserve_s, "saves": rows}
            print(f"{mode}: pool of {staging.pool.capacity / 1e9:.1f} GB pinned in {reserve_s:.1f} s; loop stall: "
                  f"first save {rows[0]['stall_s']:.3f} s, later {[round(r['stall_s'], 3) for r in rows[1:]]} s; "
                  f"host time of the first save by part: {_rounded(rows[0]['parts_s'])}", flush=True)  # fmt: skip
            hook.remove()
            staging.close()
            result["modes"][mode]["update_wait_s"] = staging.update_wait_s
            print(f"{mode}: the first update after each save waited {staging.update_wait_s} s on the device")
        dist.destroy_process_group()
    if args.json:
        args.json.write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()
