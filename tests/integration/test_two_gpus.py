"""The trainer on two GPUs (NCCL, one process each, run on an H200 x2): ZeRO-1's gradient reduce-scatter
captured inside the CUDA graphs trains exactly as the same graphs with the reduce-scatter run after the replay,
in both graph modes (issue 16: captured in place, it differed by 5.9e-3 after 4 steps)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

pytestmark = [pytest.mark.gpu, pytest.mark.multigpu]


def _history(run) -> list[tuple[int, float, float]]:
    """(step, loss, grad norm) of every logged step, bit for bit as written."""
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    return [(row["step"], row["loss"], row["grad_norm"]) for row in rows]


@pytest.mark.timeout(600)
@pytest.mark.parametrize("graph", ["per_microbatch", "full_iteration"])
def test_zero1_sync_in_the_graph_equals_the_sync_after_it(dataset, tmp_path, train_args, graph) -> None:
    runs = {}
    for in_graph in ("true", "false"):
        out = tmp_path / f"sync_in_graph_{in_graph}"
        sets = ("device=cuda", "steps=6", "optim.grad_accum=2", "precision=bf16", "data.augment=true",
                "optimizations.comm=zero1_overlap", f"optimizations.graph={graph}", "optimizations.compile=off",
                f"optimizations.sync_in_graph={in_graph}", "checkpoint.save_final=false")  # fmt: skip
        command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
                   "-m", "gr00t_train", *train_args(dataset, out, *sets)]  # fmt: skip
        done = subprocess.run(
            command, env={**os.environ, "OMP_NUM_THREADS": "1"}, capture_output=True, text=True, timeout=300
        )
        assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
        runs[in_graph] = _history(out)
    assert [step for step, _, _ in runs["true"]] == list(range(1, 7))
    assert runs["true"] == runs["false"]
