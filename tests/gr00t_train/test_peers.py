"""The pieces of a multi-process failure report, in one process: notes and beats in a TCPStore, the survivor's
line and who says it, the SIGTERM wording and hold, and `gr00t-train launch`'s argument checks. (The real
jobs are in tests/integration/test_multiprocess_failures.py and test_multinode.py.)"""

from __future__ import annotations

import json
import logging
import signal
from datetime import timedelta
from types import SimpleNamespace

import pytest
import torch.distributed as dist
from gr00t_train import _peers, _run, load_config
from gr00t_train._errors import PeerLostError
from gr00t_train._peers import Lost, PeerWatch, looks_like_lost_peer, one_line
from gr00t_train._signals import StopRequest, stop_watching, watch_start_up
from gr00t_train.cli import main


@pytest.fixture
def store():
    server = dist.TCPStore(
        "127.0.0.1", 0, is_master=True, timeout=timedelta(seconds=5), wait_for_workers=False
    )
    yield server


def _watches(store, world_size: int) -> list[PeerWatch]:
    return [PeerWatch(dist.PrefixStore("job", store), r, world_size) for r in range(world_size)]


def test_a_survivor_names_the_rank_that_left_a_note_and_the_one_that_went_silent(store, monkeypatch) -> None:
    monkeypatch.setattr(_peers, "BEAT_S", 0.05)
    zero, one, two, three = _watches(store, 4)
    one.note_death(RuntimeError("CUDA error: an illegal memory access\nmore detail"), step=7)
    two._thread.start()  # alive: its beat moves during the roll call; rank 3 never beats
    zero.step = lambda: 6
    try:
        lost = zero.lost_peers(wait_s=0.5)
    finally:
        two.close()
    assert lost == [Lost(1, 7, "RuntimeError: CUDA error: an illegal memory access"), Lost(3, 6, None)]
    assert [x.describe() for x in lost] == [
        "rank 1 died after step 7 (RuntimeError: CUDA error: an illegal memory access)",
        "rank 3 stopped answering after step 6 (killed, or its node went down; its own output may say why)",
    ]
    # Rank 0 left a note of what it found: a rank that only lost contact with rank 0 names the same ranks.
    left = json.loads(store.get("job/note/0"))
    assert left == {
        "kind": "left",
        "lost": [[1, 7, "RuntimeError: CUDA error: an illegal memory access"], [3, 6, None]],
    }


def test_a_survivor_that_finds_only_another_survivors_note_repeats_its_finding(store) -> None:
    zero, one, _ = _watches(store, 3)
    one._note({"kind": "left", "lost": [[2, 4, "DataError: episode 3 is unreadable"]]})
    zero.store.add("beat/2", 0)
    # Rank 2 has no note and no beat: silent; rank 1 left after rank 2 died and knew why: the report says it.
    assert zero.lost_peers(wait_s=0.2) == [Lost(2, 4, "DataError: episode 3 is unreadable")]


def test_every_rank_still_answering_means_the_failure_is_this_ranks_own(store, monkeypatch) -> None:
    monkeypatch.setattr(_peers, "BEAT_S", 0.05)
    zero, one = _watches(store, 2)
    one._thread.start()
    try:
        assert zero.lost_peers(wait_s=1.0) == []
    finally:
        one.close()


def test_an_unreachable_store_says_so_instead_of_guessing() -> None:
    class Gone:
        def add(self, key, value):
            raise dist.DistNetworkError("connection refused")

    watch = PeerWatch(Gone(), 0, 2)
    assert watch.lost_peers(wait_s=0.1) is None
    assert watch.peer_noted() is False
    watch.note_death(RuntimeError("x"), 1)  # best effort: no exception escapes


def test_collective_failures_are_told_from_a_ranks_own_errors() -> None:
    gloo = RuntimeError("[../gloo/transport/tcp/pair.cc:561] Connection closed by peer [127.0.0.1]:39569")
    assert looks_like_lost_peer(gloo)
    wrapped = ValueError("step failed")
    wrapped.__cause__ = dist.DistBackendError("NCCL communicator was aborted")
    assert looks_like_lost_peer(wrapped)
    assert not looks_like_lost_peer(RuntimeError("mat1 and mat2 shapes cannot be multiplied"))
    assert not looks_like_lost_peer(ValueError("bad value"))
    assert one_line(ValueError("x" * 500)).endswith("...") and len(one_line(ValueError("x" * 500))) == 200


def _saved(root, step: int, run_id: str) -> None:
    folder = root / f"step_{step:06d}"
    folder.mkdir(parents=True)
    (folder / "trainer_state.json").write_text(json.dumps({"step": step, "run_id": run_id}))


def test_the_line_names_the_newest_checkpoint_of_this_run_and_one_rank_per_node_says_it(
    tmp_path, monkeypatch
) -> None:
    cfg = load_config(preset="demo", overrides=[f"output_dir={tmp_path / 'run'}"])
    root = tmp_path / "run" / "checkpoints"
    for step, run_id in ((2, "mine"), (4, "mine"), (6, "another run's")):
        _saved(root, step, run_id)
    progress = _run._Progress()
    progress.claimed, progress.run_id = True, "mine"
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "4")  # ranks 4..7 on this node
    lost = [Lost(4, 9, "RuntimeError: boom")]
    first_alive = SimpleNamespace(rank=5, local_rank=1)
    err = _run._peer_lost_error(cfg, first_alive, progress, lost)
    assert str(err) == (
        "rank 4 died after step 9 (RuntimeError: boom); this process cannot write a checkpoint without it. "
        f"The newest intact checkpoint is {root / 'step_000004'}: continue with --resume"
    )
    assert err.speaks
    assert not _run._peer_lost_error(cfg, SimpleNamespace(rank=6, local_rank=2), progress, lost).speaks

    progress.run_id = "new"  # nothing saved yet: nothing to promise
    assert str(_run._peer_lost_error(cfg, first_alive, progress, lost)).endswith(
        f"No checkpoint of this run was saved yet ({root}): start it again"
    )


@pytest.mark.parametrize("speaks", [True, False])
def test_a_lost_peer_is_exit_code_1_said_once(tmp_path, monkeypatch, capsys, speaks) -> None:
    def lost(cfg):
        raise PeerLostError("rank 1 died after step 3 (RuntimeError: boom); ...", speaks=speaks)

    monkeypatch.setattr(_run, "run_training", lost)
    assert main(["train", "--preset", "demo", "--set", f"data.dataset={tmp_path}"]) == 1
    said = capsys.readouterr().err
    assert said == (
        "gr00t-train train: error: rank 1 died after step 3 (RuntimeError: boom); ...\n" if speaks else ""
    )


def test_the_sigterm_message_of_several_ranks_promises_no_checkpoint(caplog) -> None:
    with caplog.at_level(logging.WARNING, logger="gr00t_train._signals"):
        StopRequest(world_size=4)._handle(signal.SIGTERM, None)
        StopRequest(world_size=4, peer_noted=lambda: True)._handle(signal.SIGTERM, None)  # the peer speaks
        StopRequest()._handle(signal.SIGTERM, None)
    assert [r.getMessage() for r in caplog.records] == [
        "SIGTERM received: the 4 ranks stop together at the next logging step (logging.every), with a checkpoint "
        "if every rank gets there (Ctrl-C again to stop at once)",
        "SIGTERM received: stopping after this step with a checkpoint (Ctrl-C again to stop at once)",
    ]


def test_after_the_loop_the_first_sigterm_waits_for_the_report() -> None:
    before = signal.getsignal(signal.SIGTERM)
    previous = watch_start_up()
    try:
        StopRequest(world_size=2).install().restore()  # a loop ran and ended (say, on a lost peer)
        signal.getsignal(signal.SIGTERM)(signal.SIGTERM, None)  # held: this process is still here
    finally:
        stop_watching(previous)
    assert signal.getsignal(signal.SIGTERM) is before


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--nnodes", "2", "train"], "--nnodes 2 needs --rdzv-endpoint HOST:PORT: the first node's address"),
        (["--nproc-per-node", "2", "bench"], "launch runs `gr00t-train train` on every rank, not 'bench'"),
        (["-m", "train"], "launch always runs `python -m gr00t_train`: drop -m, --no-python, --run-path"),
        (["--join-timeout", "0", "train"], "--join-timeout must be a positive number of seconds, got 0"),
    ],
)
def test_launch_refuses_what_it_cannot_run(capsys, argv, message) -> None:
    assert main(["launch", *argv]) == 2
    assert capsys.readouterr().err.startswith(f"gr00t-train launch: error: {message}")


def test_launch_sets_the_join_timeout_and_the_workers_command() -> None:
    from gr00t_train._launch import _parse
    from torch.distributed import run as torchrun

    args, timeout = _parse(torchrun, ["--nnodes", "2", "--rdzv-endpoint", "h:29400", "--join-timeout", "90",
                                      "train", "--config", "run.yaml"])  # fmt: skip
    assert timeout == 90 and args.rdzv_backend == "c10d" and not args.standalone
    assert dict(kv.split("=") for kv in args.rdzv_conf.split(",")) == {
        "join_timeout": "90",
        "read_timeout": "90",
    }
    assert (args.module, args.training_script, args.training_script_args) == (
        True, "gr00t_train", ["train", "--config", "run.yaml"]
    )  # fmt: skip
    args, timeout = _parse(torchrun, ["--rdzv-conf", "join_timeout=30", "train"])
    assert timeout == 30 and args.standalone  # one node: torchrun's free port
