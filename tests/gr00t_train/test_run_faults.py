"""Faults of the second reliability pass: each test failed before its fix. Run folders nested in a live run's
folders, resume checks against the checkpoint's config, lost run.json, unwritable folders, malformed files,
interrupted start-up, a full disk at start."""

from __future__ import annotations

import errno
import json
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import gr00t_train
import pytest
import torch
from gr00t_train import Checkpointer, ConfigError, RunFolderError, Trainer
from gr00t_train.checkpoint.checkpointer import verify_checkpoint
from gr00t_train.cli import main
from gr00t_train.run_folder import checks as _folder_checks
from gr00t_train.run_folder import folder as _run_folder
from gr00t_train.run_folder import lock as _folder_lock

_HOLD = """
import fcntl, json, os, sys, time
folder = sys.argv[1]
os.makedirs(folder, exist_ok=True)
fd = os.open(os.path.join(folder, ".gr00t-train.lock"), os.O_RDWR | os.O_CREAT, 0o644)
fcntl.lockf(fd, fcntl.LOCK_EX)
os.ftruncate(fd, 0)
os.pwrite(fd, json.dumps({"pid": os.getpid(), "host": "elsewhere", "since": "now"}).encode(), 0)
print("held", flush=True)
time.sleep(120)
"""


@pytest.fixture
def hold(tmp_path):
    """`hold(folder)`: another live process holds `folder`'s run lock until the test ends."""
    procs = []

    def start(folder: Path) -> subprocess.Popen:
        proc = subprocess.Popen(
            [sys.executable, "-c", textwrap.dedent(_HOLD), str(folder)], stdout=subprocess.PIPE, text=True
        )
        procs.append(proc)
        assert proc.stdout.readline().strip() == "held"
        return proc

    yield start
    for proc in procs:
        proc.kill()
        proc.wait()


def _fit(standins, env, tmp_path, **overrides) -> Trainer:
    trainer = Trainer(standins.small_config(tmp_path, **overrides), standins.make_parts(), env)
    trainer.fit()
    return trainer


def _snapshot(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


# ------------------------------------------------------------------------------------------------- F1
def test_a_run_cannot_use_a_live_runs_checkpoint_folder(tmp_path, env, standins, hold) -> None:
    _fit(standins, env, tmp_path, steps=4, checkpoint__every=2)  # run A's files, in tmp/run
    a = tmp_path / "run"
    before = _snapshot(a / "checkpoints")
    proc = hold(a)  # A is live
    other = tmp_path / "other"
    for overrides in (
        {"checkpoint__dir": str(a / "checkpoints"), "checkpoint__existing_run": "overwrite"},
        {"checkpoint__existing_run": "overwrite"},
    ):
        out = other if "checkpoint__dir" in overrides else a / "checkpoints"
        cfg = standins.small_config(tmp_path, output_dir=str(out), steps=2, **overrides)
        with pytest.raises(RunFolderError) as info:
            Trainer(cfg, standins.make_parts(), env).fit()
        assert f"lies inside {a}, which another live run holds (pid {proc.pid} on host elsewhere" in str(
            info.value
        )
    assert _snapshot(a / "checkpoints") == before  # refused before writing anything there, not even a lock


def test_a_run_cannot_take_a_folder_that_contains_a_live_run(tmp_path, env, standins, hold) -> None:
    inner = tmp_path / "run" / "checkpoints"
    proc = hold(inner)  # a live run whose output_dir is this folder's checkpoints folder
    with pytest.raises(RunFolderError) as info:
        _fit(standins, env, tmp_path, steps=2, checkpoint__existing_run="overwrite")
    assert f"contains {inner}, which another live run holds (pid {proc.pid}" in str(info.value)


# ------------------------------------------------------------------------------------------------- F2
@pytest.mark.parametrize(("name", "value"), [("seed", "7"), ("data.shuffle", "false")])
def test_resume_with_another_seed_or_shuffle_stops_naming_the_field(
    tmp_path, env, standins, name, value
) -> None:
    _fit(standins, env, tmp_path, steps=4, checkpoint__every=2)
    before = {"seed": 42, "data.shuffle": True}[name]
    overrides = {name.replace(".", "__"): value}
    with pytest.raises(ConfigError) as info:
        _fit(standins, env, tmp_path, steps=4, checkpoint__resume="auto", **overrides)
    message = str(info.value)
    shown = {"seed": "7", "data.shuffle": "False"}[name]
    assert message.startswith(f"{name}: ") and f"({name} {before} -> {shown})" in message
    assert f"--set {name}={str(before).lower()}" in message


def _meta(folder: Path, text: str) -> Path:
    (folder / "meta").mkdir(parents=True)
    (folder / "meta" / "info.json").write_text(text)
    return folder


def test_resume_on_another_dataset_path(tmp_path, env, standins, caplog) -> None:
    first = _meta(tmp_path / "ds1", '{"total_episodes": 3}')
    _fit(standins, env, tmp_path, steps=6, checkpoint__every=2, data__dataset=str(first))
    shutil.rmtree(tmp_path / "run" / "checkpoints" / "step_000006")  # as if stopped after step 4
    other = _meta(tmp_path / "ds2", '{"total_episodes": 4}')
    with pytest.raises(ConfigError) as info:
        _fit(standins, env, tmp_path, steps=6, checkpoint__resume="auto", data__dataset=str(other))
    message = str(info.value)
    assert message.startswith(f"data.dataset: data.dataset={other} (the checkpoint was written on {first})")
    assert "is not the dataset" in message and "1 file changed (meta/info.json)" in message
    copy = tmp_path / "moved"
    shutil.copytree(first, copy)  # the same dataset, moved: resumes
    trainer = _fit(standins, env, tmp_path, steps=6, checkpoint__resume="auto", data__dataset=str(copy))
    assert trainer.step == 6 and "the same dataset, moved" in caplog.text


# ------------------------------------------------------------------------------------------------- F4
@pytest.mark.parametrize("how", ["auto", "path"])
def test_resume_after_run_json_was_deleted(tmp_path, env, standins, how) -> None:
    first = _fit(standins, env, tmp_path, steps=6, checkpoint__every=2).checkpointer.run_id
    shutil.rmtree(tmp_path / "run" / "checkpoints" / "step_000006")  # as if stopped after step 4
    (tmp_path / "run" / "run.json").unlink()
    resume = "auto" if how == "auto" else str(tmp_path / "run" / "checkpoints" / "step_000004")
    trainer = _fit(standins, env, tmp_path, steps=6, checkpoint__every=2, checkpoint__resume=resume)
    assert trainer.step == 6 and trainer.checkpointer.run_id == first
    assert json.loads((tmp_path / "run" / "run.json").read_text())["run_id"] == first


def test_resume_into_a_folder_with_another_run_does_not_ask_for_resume(tmp_path, env, standins) -> None:
    _fit(standins, env, tmp_path, steps=2, checkpoint__every=2)
    mine = tmp_path / "mine"
    shutil.copytree(tmp_path / "run" / "checkpoints" / "step_000002", mine / "step_000002")
    _fit(standins, env, tmp_path, steps=4, checkpoint__every=4, checkpoint__existing_run="new_run")
    with pytest.raises(RunFolderError) as info:
        _fit(standins, env, tmp_path, steps=2, checkpoint__resume=str(mine / "step_000002"))
    message = str(info.value)
    assert "besides the one being resumed" in message and "Pass --resume" not in message


# ------------------------------------------------------------------------------------------------- F6
def test_a_failed_write_during_a_save_names_the_path(tmp_path) -> None:
    ck = Checkpointer(tmp_path / "ck", keep_last=2)

    def write_model(folder: Path) -> None:
        raise PermissionError(errno.EACCES, "Permission denied", str(folder / "model.safetensors"))

    with pytest.raises(gr00t_train.CheckpointError) as info:
        ck.save(
            2,
            write_model=write_model,
            optimizer_state={},
            rank_state={},
            trainer_state={"step": 2},
            config={},
        )
    message = str(info.value)
    assert "cannot write checkpoint" in message and "Permission denied (EACCES, writing" in message
    assert "model.safetensors" in message and "no checkpoint of this run exists yet" in message
    assert not [p for p in (tmp_path / "ck").iterdir() if p.name.startswith(".tmp")]


def test_an_unwritable_folder_stops_the_run_at_its_start(tmp_path, env, standins, monkeypatch) -> None:
    def refuse(*args, **kwargs):
        raise PermissionError(errno.EACCES, "Permission denied")

    monkeypatch.setattr(_folder_checks.tempfile, "mkstemp", refuse)
    with pytest.raises(RunFolderError) as info:
        _fit(standins, env, tmp_path, steps=2)
    assert str(info.value).startswith(f"output_dir: {tmp_path / 'run'} is not writable (Permission denied)")


def test_overwrite_of_an_undeletable_run_deletes_nothing(tmp_path, env, standins, monkeypatch) -> None:
    _fit(standins, env, tmp_path, steps=4, checkpoint__every=2)
    before = _snapshot(tmp_path / "run" / "checkpoints")
    locked = tmp_path / "run" / "checkpoints" / "step_000004"
    real = os.access
    monkeypatch.setattr(_run_folder.os, "access", lambda p, mode: Path(p) != locked and real(p, mode))
    with pytest.raises(RunFolderError) as info:
        _fit(standins, env, tmp_path, steps=2, checkpoint__existing_run="overwrite")
    assert f"cannot delete {locked}: {locked} is not writable" in str(info.value)
    assert _snapshot(tmp_path / "run" / "checkpoints") == before


# ------------------------------------------------------------------------------------------- F8, F9
def test_a_malformed_safetensors_header_is_damage(tmp_path) -> None:
    from safetensors.torch import save_file

    folder = tmp_path / "step_000002"
    folder.mkdir()
    (folder / "trainer_state.json").write_text('{"step": 2}')
    save_file({"w": torch.arange(8.0)}, str(folder / "model.safetensors"))
    target = folder / "model.safetensors"
    target.write_bytes(target.read_bytes().replace(b"data_offsets", b"data_offsetz", 1))
    reason = verify_checkpoint(folder)
    assert reason.startswith("model.safetensors: its ") and "header is malformed (KeyError" in reason


def test_a_checkpoint_without_trainer_state_is_named_when_skipped(tmp_path) -> None:
    ck = Checkpointer(tmp_path / "ck", keep_last=3)
    (tmp_path / "ck").mkdir()
    (tmp_path / "ck" / "step_000002").mkdir()
    (tmp_path / "ck" / "step_000002" / "trainer_state.json").write_text('{"step": 2}')
    (tmp_path / "ck" / "step_000004").mkdir()
    path, skipped = ck.newest_intact()
    assert path.name == "step_000002"
    assert skipped == [
        f"skipped checkpoint {tmp_path / 'ck' / 'step_000004'}: trainer_state.json is missing (an incomplete save)"
    ]


def test_resume_from_a_step_that_does_not_exist(tmp_path, env, standins) -> None:
    _fit(standins, env, tmp_path, steps=4, checkpoint__every=2)
    missing = tmp_path / "run" / "checkpoints" / "step_000099"
    with pytest.raises(ConfigError) as info:
        _fit(standins, env, tmp_path, steps=6, checkpoint__resume=str(missing))
    message = str(info.value)
    assert f"{missing} cannot be resumed from: the folder does not exist" in message
    assert "holds step_000002, step_000004" in message


# ------------------------------------------------------------------------------------------------ F10
def test_infer_verifies_an_explicit_checkpoint_folder(tmp_path) -> None:
    from gr00t_train.validation.infer import find_checkpoint

    ck = Checkpointer(tmp_path / "ck", keep_last=2)
    final = ck.save(
        2,
        write_model=lambda folder: torch.save({"w": torch.zeros(4)}, folder / "weights.pt"),
        optimizer_state={},
        rank_state={},
        trainer_state={"step": 2},
        config={"steps": 2},
    )
    (final / "weights.pt").write_bytes(b"garbage")
    with pytest.raises(gr00t_train.DataError) as info:
        find_checkpoint(final)
    assert f"--checkpoint: {final} cannot be used: weights.pt has 7 bytes, the manifest says" in str(
        info.value
    )


# ------------------------------------------------------------------------------------------------ F12
@pytest.mark.parametrize(
    ("name", "content", "expected"),
    [
        ("bad.yaml", b"steps: 3\ndata: [1, 2\n", "cannot parse: line 3, column 1"),
        ("latin.yaml", b"steps: 3\n# caf\xe9\n", "not UTF-8 text: byte 0xe9 at line 2, column 6"),
        (
            "bad.json",
            b'{"steps": 3,\n}',
            "cannot parse: Expecting property name enclosed in double quotes: line 2 column 1",
        ),
    ],
)
def test_a_malformed_config_file_names_file_and_place(tmp_path, name, content, expected) -> None:
    path = tmp_path / name
    path.write_bytes(content)
    with pytest.raises(ConfigError) as info:
        gr00t_train.load_config(path)
    assert str(info.value).startswith(f"{path}: {expected}")


# ------------------------------------------------------------------------------------ F13, dataset
def test_an_output_dir_that_is_a_file(tmp_path, env, standins) -> None:
    (tmp_path / "run").write_text("not a folder")
    with pytest.raises(RunFolderError, match=r"output_dir: .*run is a file, not a folder"):
        _fit(standins, env, tmp_path, steps=2)
    (tmp_path / "ck").write_text("not a folder")
    with pytest.raises(RunFolderError, match=r"checkpoint.dir: .*ck is a file, not a folder"):
        _fit(
            standins,
            env,
            tmp_path,
            steps=2,
            output_dir=str(tmp_path / "out"),
            checkpoint__dir=str(tmp_path / "ck"),
        )


def test_a_run_never_writes_into_its_dataset(tmp_path, env, standins) -> None:
    dataset = _meta(tmp_path / "ds", "{}")
    with pytest.raises(ConfigError, match=r"output_dir: .* is inside the dataset folder"):
        _fit(standins, env, tmp_path, steps=2, data__dataset=str(dataset), output_dir=str(dataset / "runs"))
    assert sorted(p.name for p in dataset.iterdir()) == ["meta"]


# ------------------------------------------------------------------------------------------ F17, F20
def _train_argv(tmp_path: Path) -> list[str]:
    return [
        "train",
        "--preset",
        "demo",
        "--set",
        f"data.dataset={tmp_path}",
        "--set",
        f"output_dir={tmp_path / 'run'}",
    ]


def test_ctrl_c_during_start_up_is_one_line(tmp_path, monkeypatch, capsys) -> None:
    def interrupted(cfg):
        raise KeyboardInterrupt

    monkeypatch.setattr(gr00t_train._run, "run_training", interrupted)
    monkeypatch.setattr(gr00t_train._signals, "_loop_began", False)
    assert main(_train_argv(tmp_path)) == 130
    assert capsys.readouterr().err == "gr00t-train train: interrupted during start-up; nothing to save\n"


def test_a_full_disk_at_start_names_the_file_and_does_not_advise_resume(
    tmp_path, monkeypatch, capsys
) -> None:
    def full(fd, data, offset):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(_folder_lock.os, "pwrite", full)
    dataset = _meta(tmp_path / "ds", "{}")
    argv = ["train", "--preset", "demo", "--set", "device=cpu", "--set", f"data.dataset={dataset}"]
    argv += ["--set", f"output_dir={tmp_path / 'run'}"]
    assert main(argv) == 1
    err = capsys.readouterr().err
    lock = tmp_path / "run" / ".gr00t-train.lock"
    assert f"No space left on device (ENOSPC) writing {lock}; free space, then run again" in err
    assert "--resume" not in err


def test_a_full_disk_while_writing_run_json_names_it_and_leaves_no_temporary_file(
    tmp_path, monkeypatch, capsys
) -> None:
    real_write = Path.write_text

    def full(self, *args, **kwargs):
        if self.name == ".run.json.tmp":
            real_write(self, "")  # the file exists, empty, as when the disk fills during the write
            raise OSError(errno.ENOSPC, "No space left on device")  # write() errors name no file
        return real_write(self, *args, **kwargs)

    monkeypatch.setattr(Path, "write_text", full)
    dataset = _meta(tmp_path / "ds", "{}")
    out = tmp_path / "run"
    argv = ["train", "--preset", "demo", "--set", "device=cpu", "--set", f"data.dataset={dataset}"]
    argv += ["--set", f"output_dir={out}"]
    assert main(argv) == 1
    err = capsys.readouterr().err
    assert f"No space left on device (ENOSPC) writing {out / 'run.json'}; free space, then run again" in err
    assert not (out / ".run.json.tmp").exists()


def test_a_start_up_ctrl_c_that_python_dropped_stops_the_run_when_the_loop_begins() -> None:
    """Python drops a KeyboardInterrupt raised inside an import lock's or a weakref's callback; the start-up
    handler remembers the Ctrl-C, and the loop's install() answers it instead of training on."""
    import signal

    from gr00t_train._signals import StopRequest, stop_watching, watch_start_up

    before = signal.getsignal(signal.SIGINT)
    previous = watch_start_up()
    try:
        with pytest.raises(KeyboardInterrupt):
            signal.getsignal(signal.SIGINT)(signal.SIGINT, None)  # the handler raises...
        # ...and had the raise been dropped, the loop would still stop before taking over
        stop = StopRequest()
        with pytest.raises(KeyboardInterrupt):
            stop.install()
        assert signal.getsignal(signal.SIGINT) != stop._handle  # it did not take SIGINT over
    finally:
        stop_watching(previous)
    assert signal.getsignal(signal.SIGINT) is before
    StopRequest().install().restore()  # forgotten once the command ends: a later loop starts normally
