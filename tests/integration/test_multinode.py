"""Several nodes on one host: two `gr00t-train launch --nnodes 2` processes meet at a c10d rendezvous and
train together (gloo on CPU); a node that never starts fails the other within --join-timeout, with a message
naming the rendezvous endpoint."""

from __future__ import annotations

import json
import socket
import time

import pytest
from _launch_job import start


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _node(port: int, join_timeout: int) -> list[str]:
    return ["--nnodes", "2", "--nproc-per-node", "1", "--rdzv-endpoint", f"127.0.0.1:{port}",
            "--join-timeout", str(join_timeout)]  # fmt: skip


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_two_nodes_on_one_host_train_together(dataset, tmp_path, train_args, losses) -> None:
    out = tmp_path / "run"
    argv = train_args(dataset, out, "steps=3", "checkpoint.every=3")
    port = _free_port()
    nodes = [start(tmp_path / f"node{n}", argv, _node(port, 60)) for n in (0, 1)]
    results = [node.finish(timeout=150) for node in nodes]

    assert [code for code, _ in results] == [0, 0], results
    assert sorted(losses(out)) == [1, 2, 3]
    ck = out / "checkpoints" / "step_000003"
    assert (ck / "rank00000.pt").is_file() and (ck / "rank00001.pt").is_file()
    assert json.loads((ck / "trainer_state.json").read_text())["world_size"] == 2
    # One rank per node: each launcher ran one of the two ranks.
    stderr = [node.rank_stderr(0) for node in nodes]
    assert sum("rank 0 of 2" in text for text in stderr) == 1


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_a_missing_node_fails_within_the_join_timeout_naming_the_endpoint(
    dataset, tmp_path, train_args
) -> None:
    port, timeout = _free_port(), 5
    node = start(tmp_path / "node0", train_args(dataset, tmp_path / "run"), _node(port, timeout))
    code, output = node.finish(timeout=90)
    elapsed = time.monotonic() - node.started

    assert code == 2, output[-3000:]
    assert output.strip().splitlines()[-1] == (
        f"gr00t-train launch: error: fewer than 2 nodes joined the rendezvous at 127.0.0.1:{port} within "
        f"{timeout} s (--join-timeout). Start the same command on every node (the same --nnodes and rendezvous "
        f"address), check that 127.0.0.1:{port} is reachable from each, or raise --join-timeout if nodes start "
        "slowly"
    )
    assert "Traceback" not in output
    assert timeout <= elapsed < timeout + 20  # the interpreter's and torch's start-up besides the wait
    assert not (tmp_path / "run").exists()  # no worker started
