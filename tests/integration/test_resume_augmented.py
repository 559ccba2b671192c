"""Bit-exact resume with image augmentation on (random crops and color jitter on the device step), tested
the way a user hits it: `kill -9` of a running `gr00t-train train`, then `--resume`, compared with an
uninterrupted run, at one rank and at two ranks (torchrun, gloo on CPU).

Augmentation draws come from each sample's `sample_seed`, a function of the run's seed, the epoch and the
sample's place in the epoch's global order (so of the rank too): a resumed run draws what the original
would have drawn. (Before, the host step dropped `sample_seed` and every run, rank and resume drew from a
fixed seed-0 generator.)
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import gr00t_model
import pytest
import torch
from _launch_job import descendants
from gr00t_train.checkpoint.restore import load_pretrained
from gr00t_train.cli import main

STEPS, EVERY = 16, 4  # killed at the first checkpoint: 12 steps left to interrupt


def _argv(dataset: Path, out: Path, *sets: str) -> list[str]:
    base = [f"data.dataset={dataset}", f"output_dir={out}", "device=cpu", f"steps={STEPS}",
            f"checkpoint.every={EVERY}", "data.batch_size=4", "data.num_workers=1", "data.augment=true",
            "logging.every=1", "logging.progress=false", "logging.plots=false", "logging.tensorboard=false",
            "optimizations.comm=zero1_overlap"]  # fmt: skip
    argv = ["train", "--preset", "demo"]
    for item in [*base, *sets]:
        argv += ["--set", item]
    return argv


def _command(ranks: int) -> list[str]:
    if ranks == 1:
        return [sys.executable, "-m", "gr00t_train"]
    # --standalone: torchrun binds a free port itself (probing one first races with other jobs)
    return [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", str(ranks),
            "-m", "gr00t_train"]  # fmt: skip


def _kill_9(pid: int) -> None:
    """SIGKILL a process and everything it started (launcher, ranks, data workers): the whole job dies."""
    for victim in [*descendants(pid), pid]:
        with contextlib.suppress(ProcessLookupError):  # already gone
            os.kill(victim, signal.SIGKILL)


def _run_cli(ranks: int, argv: list[str], kill_when: Path | None = None) -> None:
    """Run `gr00t-train` (under torchrun for 2 ranks) to the end, or kill -9 it once a checkpoint exists."""
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.Popen([*_command(ranks), *argv], env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, start_new_session=True)  # fmt: skip
    try:
        if kill_when is None:
            out, _ = proc.communicate(timeout=240)
            assert proc.returncode == 0, out[-4000:]
            return
        deadline = time.monotonic() + 240
        while not list(kill_when.glob("step_*")):
            assert proc.poll() is None, (
                "the run ended before it could be killed:\n" + proc.stdout.read()[-4000:]
            )
            assert time.monotonic() < deadline, "no checkpoint appeared"
            time.sleep(0.01)
        assert proc.poll() is None, "the run finished before the kill"
        _kill_9(proc.pid)  # mid-run
        proc.wait(timeout=30)
    finally:
        if proc.poll() is None:
            _kill_9(proc.pid)
            proc.wait()


def _final_weights(out: Path) -> dict[str, torch.Tensor]:
    model, report = load_pretrained(out / "checkpoints" / f"step_{STEPS:06d}")  # ZeRO-1's masters resolved
    assert report.missing == []
    return model.state_dict()


@pytest.mark.slow
@pytest.mark.timeout(600)
@pytest.mark.parametrize("ranks", [1, 2])
def test_kill_9_then_resume_with_augmentation_is_bit_exact(dataset, tmp_path, losses, ranks) -> None:
    reference, interrupted = tmp_path / "reference", tmp_path / "interrupted"
    if ranks == 1:  # the uninterrupted run and the resume in this process: the same CLI, less start-up
        assert main(_argv(dataset, reference)) == 0
    else:
        _run_cli(ranks, _argv(dataset, reference))
    _run_cli(ranks, _argv(dataset, interrupted), kill_when=interrupted / "checkpoints")
    time.sleep(0.5)  # anything the kill missed would show up here
    done = sorted(p.name for p in (interrupted / "checkpoints").glob("step_*"))
    assert done and f"step_{STEPS:06d}" not in done, done  # killed mid-run, after a checkpoint
    if ranks == 1:
        assert main([*_argv(dataset, interrupted), "--resume"]) == 0
    else:
        _run_cli(ranks, [*_argv(dataset, interrupted), "--resume"])

    expected, resumed = losses(reference), losses(interrupted)
    assert sorted(resumed) == list(range(1, STEPS + 1))
    assert resumed == expected  # every step, the resumed ones included, bit for bit
    a, b = _final_weights(reference), _final_weights(interrupted)
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_augmentation_draws_follow_seed_rank_and_position(dataset) -> None:
    """The device step's crops and jitter: the same for the same (seed, epoch, place); different for another
    seed and on another rank (a missing `sample_seed` drew the same fixed-seed crops everywhere)."""
    import gr00t_train
    import numpy as np
    import vla_io
    from gr00t_train.data import dataset as _data

    def first_batch(seed: int, rank: int, world: int):
        cfg = gr00t_train.load_config(preset="demo", overrides=[f"data.dataset={dataset}", f"seed={seed}",
                                                                 "data.augment=true"])  # fmt: skip
        data = _data.open_dataset(cfg, model_horizon=16, progress=False)
        config = gr00t_model.GR00TConfig.preset("tiny")
        processor = _data.make_processor(data, config, None, vlm_seq_len=None)
        augment = _data.image_transform(processor, len(data.camera_keys), augment=True, backend="torch")
        drawn, params = [], augment.params
        augment.params = lambda *a, **k: drawn.append(params(*a, **k)) or drawn[-1]
        with vla_io.Pipeline(data.dataset, 4, transform=_data.host_transform(data, processor),
                             device_transform=augment, seed=seed, rank=rank, world_size=world,
                             shuffle=False, synchronous=True, device="cpu") as pipe:  # fmt: skip
            pixels = next(iter(pipe))["pixel_values"]
        return pixels, np.stack([drawn[0].y0, drawn[0].x0, drawn[0].brightness, drawn[0].hue])

    pixels, base = first_batch(42, 0, 1)
    again, same = first_batch(42, 0, 1)
    assert torch.equal(pixels, again) and np.array_equal(base, same)  # a pure function of its inputs
    assert not np.array_equal(base, first_batch(7, 0, 1)[1])  # cfg.seed reaches the draws
    rank0, rank1 = first_batch(42, 0, 2), first_batch(42, 1, 2)
    assert not np.array_equal(rank0[1], rank1[1])  # ranks draw differently for their i-th samples
    # unshuffled, rank 1 of 2 holds global places 1, 3, 5, 7 and a single rank places 0, 1, 2, 3: the same
    # frame at the same place gets the same draws, whichever rank loads it
    assert torch.equal(rank1[0][0], pixels[1]) and torch.equal(rank1[0][1], pixels[3])
