"""A Pipeline releases its threads and worker processes without `close()`: when garbage collected, and at
interpreter exit without the abort a daemon thread inside torch used to cause."""

from __future__ import annotations

import gc
import subprocess
import sys
import textwrap
import threading

from vla_io import LeRobotDataset, Pipeline

_EXIT_SCRIPT = """
import torch
from vla_io import LeRobotDataset, Pipeline

calls = []

def busy(batch):  # from the second batch on, the host thread sits inside long torch ops
    calls.append(1)
    if len(calls) > 1:
        x = torch.rand(1000, 1000)
        for _ in range(3):
            x = torch.tanh(x @ x)
    return batch

pipe = Pipeline(LeRobotDataset({root!r}, progress=False), 4, transform=busy, num_workers=1, device="cpu")
for batch in pipe:
    break
print("left without close()", flush=True)
"""


def test_exit_without_close_is_clean(synth_root, tmp_path):
    script = tmp_path / "leave.py"
    script.write_text(textwrap.dedent(_EXIT_SCRIPT.format(root=str(synth_root("v2.1", "h264")))))
    proc = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=120)
    assert "left without close()" in proc.stdout
    assert proc.returncode == 0, proc.stderr[-2000:]  # was -6 (SIGABRT): "terminate called without ..."
    assert "terminate called" not in proc.stderr


def _pipeline_threads() -> list[str]:
    return [t.name for t in threading.enumerate() if t.name.startswith("vla-io-")]


def test_garbage_collection_stops_threads_and_workers(synth_root):
    pipe = Pipeline(
        LeRobotDataset(synth_root("v2.1", "h264"), progress=False), 4, num_workers=2, device="cpu"
    )
    next(iter(pipe))
    workers = list(pipe._producer._pool._procs)
    assert len(_pipeline_threads()) == 2 and all(w.is_alive() for w in workers)
    del pipe
    gc.collect()
    assert _pipeline_threads() == []
    for worker in workers:
        worker.join(timeout=10)
        assert not worker.is_alive()


def test_context_manager_closes(synth_root):
    with Pipeline(LeRobotDataset(synth_root("v2.1", "h264"), progress=False), 4, num_workers=1) as pipe:
        next(iter(pipe))
        assert len(_pipeline_threads()) == 2
    assert _pipeline_threads() == []
