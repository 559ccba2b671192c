"""Session fixtures of the vla_overlap tests: one pool of four gloo worker processes."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

HERE = str(Path(__file__).resolve().parent)
if HERE not in sys.path:  # the spawned workers inherit sys.path and import their helpers from here
    sys.path.insert(0, HERE)


@pytest.fixture(scope="session")
def pool():
    from _overlap_pool import WorkerPool

    workers = WorkerPool()
    yield workers
    workers.close()
