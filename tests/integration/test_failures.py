"""Bad input stops `gr00t-train` early with a message that names the culprit; a run killed while saving
leaves the previous checkpoint intact; two processes train together under torchrun (gloo)."""

from __future__ import annotations

import collections
import contextlib
import hashlib
import json
import logging
import os
import re
import shutil
import signal
import subprocess
import sys
import textwrap
import time

import pyarrow.parquet as pq
import pytest
import torch
import vla_io
from _torchrun import torchrun
from gr00t_train.cli import main


def _run_cli(argv, capsys) -> tuple[int, str]:
    code = main(argv)
    return code, capsys.readouterr().err


def test_missing_dataset(tmp_path, train_args, capsys) -> None:
    code, err = _run_cli(train_args(tmp_path / "nowhere", tmp_path / "run"), capsys)
    assert code == 2 and f"data.dataset: {tmp_path / 'nowhere'} is not a directory" in err


def test_missing_dataset_file(dataset_copy, tmp_path, train_args, capsys) -> None:
    (dataset_copy / "meta" / "info.json").unlink()
    code, err = _run_cli(train_args(dataset_copy, tmp_path / "run"), capsys)
    assert code == 2 and "cannot use dataset" in err and "meta/info.json" in err


def test_missing_video_file(dataset_copy, tmp_path, train_args, capsys) -> None:
    video = next(dataset_copy.glob("videos/**/episode_000001.mp4"))
    video.unlink()
    code, err = _run_cli(train_args(dataset_copy, tmp_path / "run"), capsys)
    assert code == 2 and "cannot use dataset" in err
    assert "episode_000001.mp4" in err and "episode 1" in err and "observation.images." in err


def test_non_finite_statistics_stop_the_run_naming_key_and_index(
    dataset_copy, tmp_path, train_args, capsys
) -> None:
    stats_path = dataset_copy / "meta" / "stats.json"
    stats = json.loads(stats_path.read_text())
    stats["action"]["max"][5] = float("inf")
    stats_path.write_text(json.dumps(stats))
    code, err = _run_cli(train_args(dataset_copy, tmp_path / "run"), capsys)
    assert code == 2 and "stats.json 'action' 'max' is inf at index 5 (joint group 'eef_delta_rot')" in err
    assert not (tmp_path / "run" / "checkpoints").exists()


def test_unknown_camera(dataset, tmp_path, train_args, capsys) -> None:
    code, err = _run_cli(train_args(dataset, tmp_path / "run", "data.cameras=[image, front]"), capsys)
    assert code == 2
    assert "data.cameras: camera 'front' is not in dataset" in err and "image, wrist_image" in err


def test_unknown_joint_group(dataset, tmp_path, train_args, capsys) -> None:
    code, err = _run_cli(train_args(dataset, tmp_path / "run", "data.action_keys=[gripper, wheel]"), capsys)
    assert code == 2 and "data.action_keys: 'wheel' is not a numeric vector feature of dataset" in err
    assert (
        "has action groups eef_delta_pos, eef_delta_rot, gripper" in err
        and "observation.state (float32[8])" in err
    )


@pytest.mark.parametrize(("value", "cells"), [("nan", "column"), ("inf", "one")])
def test_non_finite_data_stops_naming_episode_and_frame(
    dataset_copy, tmp_path, train_args, capsys, value, cells
) -> None:
    # Episode 1's actions (all of them, or one cell) become NaN/inf after the statistics were computed:
    # caught on the host before normalization (which clips inf to 1 and would train on it silently).
    path = next(dataset_copy.glob("data/**/episode_000001.parquet"))
    table = pq.read_table(path)
    actions = table.column("action").to_pylist()
    if cells == "column":
        actions = [[float(value)] * len(row) for row in actions]
    else:
        actions[3][2] = float(value)
    column = table.schema.get_field_index("action")
    import pyarrow as pa

    table = table.set_column(column, "action", pa.array(actions, type=table.schema.field("action").type))
    pq.write_table(table, path)
    code, err = _run_cli(train_args(dataset_copy, tmp_path / "run", "steps=12"), capsys)
    assert code == 2 and "holds NaN/inf raw values" in err, err
    named = re.findall(r"episode (\d+), frame (\d+): action\[(\d+)\] is (\w+)", err)
    assert named and {episode for episode, *_ in named} == {"1"}
    if cells == "one":
        assert set(named) == {("1", "3", "2", "inf")}
    assert not (tmp_path / "run" / "checkpoints").exists()
    # `vla-io check` finds the same rows before any training, by episode and frame.
    report = vla_io.check_dataset(dataset_copy, workers=1, progress=False)
    frames = f"0-{len(actions) - 1}" if cells == "column" else "3"
    assert [(p.episode, p.key, p.frames) for p in report.problems] == [(1, "action", frames)]


def test_in_process_batches_train_bit_identically(dataset, tmp_path, train_args, losses) -> None:
    # data.num_workers=0 leaves every core to compute: with 2+ threads torch's CPU index_put_(accumulate)
    # (the backward of the action head's W[slot]) once summed in a racy order; runs differed by an ulp.
    if (os.cpu_count() or 1) < 2:
        pytest.skip("needs 2 cores for 2 compute threads")
    hashes = []
    for name in ("a", "b"):
        out = tmp_path / name
        assert (
            main(train_args(dataset, out, "steps=10", "data.num_workers=0", "checkpoint.save_final=true"))
            == 0
        )
        weights = sorted(out.glob("checkpoints/step_000010/*.safetensors"))
        assert weights
        hashes.append([hashlib.sha256(w.read_bytes()).hexdigest() for w in weights])
        hashes[-1].append(losses(out))
    assert hashes[0] == hashes[1]


_KILLED = """
import sys, time
from pathlib import Path
import gr00t_train.checkpoint.checkpointer as ck
from gr00t_train.cli import main

real = ck.Seal.finish
saves = []
def seal_then_hang(seal, extra):
    manifest = real(seal, extra)
    saves.append(seal.folder)
    if len(saves) == 2:  # the second checkpoint is complete on disk but not yet renamed into place
        Path({marker!r}).write_text(str(seal.folder))
        time.sleep(600)
    return manifest
ck.Seal.finish = seal_then_hang
sys.exit(main({argv!r}))
"""


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_kill_during_save_keeps_the_previous_checkpoint(
    dataset, tmp_path, train_args, losses, capsys
) -> None:
    out = tmp_path / "run"
    argv = train_args(dataset, out, "checkpoint.every=2", "steps=4")
    marker = tmp_path / "SAVING"
    script = tmp_path / "killed.py"
    script.write_text(textwrap.dedent(_KILLED.format(marker=str(marker), argv=argv)))
    proc = subprocess.Popen([sys.executable, str(script)], env={**os.environ, "OMP_NUM_THREADS": "1"})
    try:
        deadline = time.monotonic() + 200
        while not marker.exists():
            assert proc.poll() is None, "training ended before its second checkpoint"
            assert time.monotonic() < deadline, "the second checkpoint never started"
            time.sleep(0.2)
        # A second run into the folder of a live one exits 2 naming the holder, and leaves it alone.
        code = main([*argv, "--resume"])
        err = capsys.readouterr().err
        assert code == 2 and f"is in use by another run: pid {proc.pid} on host" in err
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    root = out / "checkpoints"
    run_id = json.loads((out / "run.json").read_text())["run_id"]
    assert sorted(p.name for p in root.iterdir()) == [f".tmp-{run_id}-step_000004", "step_000002"]

    # The resumed run picks step 2, removes the half-published save and finishes.
    assert main([*argv, "--resume"]) == 0
    assert sorted(p.name for p in root.iterdir()) == ["step_000002", "step_000004"]
    assert sorted(losses(out)) == [1, 2, 3, 4]


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_two_processes_with_gloo(dataset, tmp_path, train_args, losses) -> None:
    out = tmp_path / "run"
    sets = ("checkpoint.every=3", "optimizations.comm=overlap", "optim.min_lr_ratio=0.1")
    argv = train_args(dataset, out, "steps=3", *sets)
    code, output = torchrun("-m", "gr00t_train", *argv)
    assert code == 0, output[-5000:]
    assert sorted(losses(out)) == [1, 2, 3]
    ck = out / "checkpoints" / "step_000003"
    assert (ck / "rank00000.pt").is_file() and (ck / "rank00001.pt").is_file()
    state = json.loads((ck / "trainer_state.json").read_text())
    assert state["world_size"] == 2 and state["global_batch"] == 8
    assert "rank 0 of 2" in output
    # Rank 0 speaks for the run: no log line twice (the same INFO lines used to come from every rank).
    logged = [
        line.split(" ", 1)[1]
        for line in output.splitlines()
        if re.match(r"\d\d:\d\d:\d\d (INFO|WARN|ERROR)", line)
    ]
    assert logged and not [line for line, n in collections.Counter(logged).items() if n > 1]
    # The two ranks' checkpoint continues on one process (the data order where both stopped, the schedule).
    argv = train_args(dataset, out, "steps=5", *sets)
    assert main([*argv, "--resume", "--resume-changed", "steps"]) == 0
    assert sorted(losses(out)) == [1, 2, 3, 4, 5]
    state = json.loads((out / "checkpoints" / "step_000005" / "trainer_state.json").read_text())
    assert state["world_size"] == 1 and state["samples_seen"] == 3 * 8 + 2 * 4
    assert (
        torch.load(out / "checkpoints" / "step_000005" / "rank00000.pt")["data"]["consumed"] == 3 * 8 + 2 * 4
    )


def test_other_ranks_leave_shared_errors_to_rank_0(tmp_path, train_args, capsys, monkeypatch) -> None:
    # Under torchrun every rank hits a config error alike: only rank 0 prints it. Errors that may be a
    # rank's own (data) are printed with the rank in front.
    monkeypatch.setenv("RANK", "1")
    code, err = _run_cli([*train_args(tmp_path, tmp_path / "run"), "--set", "optim.lr=inf"], capsys)
    assert code == 2 and err == ""
    from gr00t_train.cli import _say, build_parser

    _say(build_parser().parse_args(["train"]), "error: worker 0 of this rank stalled")
    assert capsys.readouterr().err == "[rank 1] gr00t-train train: error: worker 0 of this rank stalled\n"


_DISK_FULL = r"""
mount -t tmpfs -o size=40m tmpfs "$CK" || exit 97
"$PYTHON" -m gr00t_train "$@" > "$OUT/stdout" 2> "$OUT/stderr"
echo $? > "$OUT/rc"
cp -r "$CK" "$OUT/copy"
"""


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_a_full_disk_stops_with_a_message_and_keeps_earlier_checkpoints(
    dataset, tmp_path, train_args
) -> None:
    # A real full file system: a 40 MB tmpfs for checkpoints of about 17 MB each (a private mount namespace
    # of an unprivileged user namespace, so no root is needed where those are allowed).
    if shutil.which("unshare") is None:
        pytest.skip("needs unshare (util-linux) for a private tmpfs")
    ck = tmp_path / "ck"
    ck.mkdir()
    argv = train_args(
        dataset, tmp_path / "run", "checkpoint.every=2", "checkpoint.keep_last=5", f"checkpoint.dir={ck}"
    )
    env = {
        **os.environ,
        "OMP_NUM_THREADS": "1",
        "CK": str(ck),
        "OUT": str(tmp_path),
        "PYTHON": sys.executable,
    }
    cmd = ["unshare", "--user", "--map-root-user", "--mount", "bash", "-c", _DISK_FULL, "bash", *argv]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=200)
    if proc.returncode in (1, 97) and not (tmp_path / "rc").exists():
        pytest.skip(f"cannot mount a private tmpfs here: {proc.stderr.strip()[-300:]}")
    err = (tmp_path / "stderr").read_text()
    assert (tmp_path / "rc").read_text().strip() == "1", err[-3000:]
    assert f"error: cannot write checkpoint {ck / 'step_000006'}: No space left on device" in err
    assert "Traceback" not in err
    copy = tmp_path / "copy"
    assert sorted(p.name for p in copy.iterdir() if not p.name.startswith(".gr00t")) == [
        "step_000002",
        "step_000004",
    ]  # the partial save is gone, the earlier ones are whole
    from gr00t_train import Checkpointer

    assert Checkpointer(copy, keep_last=5).newest_intact()[0].name == "step_000004"


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_sigterm_to_the_job_saves_a_checkpoint_and_says_so(dataset, tmp_path, train_args, losses) -> None:
    # A scheduler's preemption: SIGTERM to the whole process group (the data workers included).
    out = tmp_path / "run"
    argv = train_args(dataset, out, "steps=300", "data.num_workers=2")
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.Popen([sys.executable, "-m", "gr00t_train", *argv], env=env, stderr=subprocess.PIPE,
                            stdout=subprocess.DEVNULL, text=True, start_new_session=True)  # fmt: skip
    try:
        deadline = time.monotonic() + 150
        while not (out / "metrics.jsonl").is_file() or not (out / "metrics.jsonl").read_text():
            assert proc.poll() is None and time.monotonic() < deadline, "training did not start"
            time.sleep(0.1)
        os.killpg(proc.pid, signal.SIGTERM)
        _, err = proc.communicate(timeout=120)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
    assert proc.returncode == 128 + signal.SIGTERM, err[-3000:]
    last = err.strip().splitlines()[-1]
    match = re.fullmatch(
        r"gr00t-train train: stopped by SIGTERM at step (\d+): saved checkpoint (\S+); continue with --resume",
        last,
    )
    assert match, last
    step = int(match.group(1))
    assert match.group(2) == str(out / "checkpoints" / f"step_{step:06d}") and 1 <= step < 300
    assert sorted(losses(out)) == list(range(1, step + 1))
    # the same schedule, stopping earlier: a change of `steps` that a resume allows when named
    assert (
        main(train_args(dataset, out, f"steps={step + 2}") + ["--resume", "--resume-changed", "steps"]) == 0
    )
    assert sorted(losses(out)) == list(range(1, step + 3))


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_a_stalled_worker_stops_the_run_naming_the_setting(dataset_copy, tmp_path, train_args) -> None:
    # A decoder that hangs for real: episode 1's video becomes a FIFO with no writer, so opening it blocks
    # forever (as on a hung network file system). The run stops after data.worker_timeout_s, not 300 s,
    # and the message names the setting to raise.
    video = next(dataset_copy.glob("videos/**/observation.images.image/episode_000001.mp4"))
    video.unlink()
    os.mkfifo(video)
    argv = train_args(dataset_copy, tmp_path / "run", "steps=500", "data.worker_timeout_s=3")
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.Popen([sys.executable, "-m", "gr00t_train", *argv], env=env, stderr=subprocess.PIPE,
                            stdout=subprocess.DEVNULL, text=True, start_new_session=True)  # fmt: skip
    try:
        _, err = proc.communicate(timeout=150)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)  # a worker left behind, if any
    assert proc.returncode == 2, err[-3000:]
    assert (
        "error: a data worker stalled: worker 0 (pid" in err
        and "alive, now stopped) had not delivered batch" in err
    )
    assert "longer than data.worker_timeout_s=3 s" in err and "raise data.worker_timeout_s" in err
    assert "Traceback" not in err


@pytest.mark.slow
def test_undecodable_samples_are_skipped_up_to_the_budget(
    dataset_copy, tmp_path, train_args, capsys, caplog
) -> None:
    video = next(dataset_copy.glob("videos/**/observation.images.image/episode_000001.mp4"))
    video.write_bytes(video.read_bytes()[: video.stat().st_size // 3])  # cut short, as by a full disk
    # A third of the samples cannot be decoded: within a budget of half, training runs through.
    out = tmp_path / "run"
    with caplog.at_level(logging.WARNING):
        code, err = _run_cli(train_args(dataset_copy, out, "data.max_bad_fraction=0.5"), capsys)
    assert code == 0, err[-3000:]
    skipped = json.loads((out / "summary.json").read_text())["skipped_samples"]
    assert skipped > 0
    warned = [r.getMessage() for r in caplog.records if "which cannot be decoded" in r.getMessage()]
    assert len(warned) == 1 and "(episode 1, frame " in warned[0] and str(video) in warned[0]
    # The default budget (1% of the samples) is exceeded at once: exit 2, naming the setting.
    code, err = _run_cli(train_args(dataset_copy, tmp_path / "strict"), capsys)
    assert code == 2 and "and were skipped, more than data.max_bad_fraction=0.01" in err
    assert "vla-io check DATASET" in err
