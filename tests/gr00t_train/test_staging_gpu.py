"""Checkpoint staging on CUDA (run on a GPU host: `pytest tests/gr00t_train/test_staging_gpu.py -m gpu`):
ZeRO-1 at one rank over NCCL with the flat step, the update on a side stream (vla_overlap.UpdateStream). The
save's copies run on their own stream beside the next steps; the updates wait for them (the step pre-hook).
Staged tensors equal the state at the save step bit for bit, every original changed before the test waited
for the copies, the copies land in pinned memory, and the second save reuses the first one's slots; with the
state copied on the device first, the updates do not wait for the host copies."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest
import torch
import torch.distributed as dist


def _load_scenario():
    """The scenario shared with the other staging test file (tests are not a package)."""
    name = "gr00t_train_staging_scenario"
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, Path(__file__).with_name("_staging_scenario.py"))
        sys.modules[name] = module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
    return sys.modules[name]


stage_while_training = _load_scenario().stage_while_training

pytestmark = pytest.mark.gpu


@pytest.fixture(scope="module")
def nccl(tmp_path_factory):
    if dist.is_initialized():
        pytest.skip("a process group already exists in this process")
    torch.cuda.set_device(0)
    store = tmp_path_factory.mktemp("nccl") / "store"
    dist.init_process_group("nccl", init_method=f"file://{store}", rank=0, world_size=1)
    yield dist.group.WORLD
    dist.destroy_process_group()


@pytest.mark.parametrize("device_copies", [False, True], ids=["host-copies-guarded", "device-snapshot"])
@pytest.mark.parametrize("side_stream", [True, False], ids=["update-on-side-stream", "update-in-order"])
def test_staged_state_survives_the_next_updates_on_cuda(nccl, side_stream: bool, device_copies: bool) -> None:
    # 2048 wide: 16.8 M parameters, 200 MB of masters and moments, copies of milliseconds that the next
    # steps' updates would overwrite if they did not wait (or read a snapshot)
    result = stage_while_training(
        torch.device("cuda"), width=2048, saves=2, side_stream=side_stream, device_copies=device_copies
    )
    first, second = result["saves"]
    for save in (first, second):
        assert save["equal"] and save["changed"] and save["groups"] and save["pinned"]
        assert (save["snapshot_bytes"] > 0) == device_copies
        assert save["update_waited"] == (not device_copies)  # a snapshot: the updates need not wait
    assert second["addresses"] == first["addresses"] and second["grown"] == 0
    waits = result["update_wait_s"]  # one per save; none with a snapshot
    assert len(waits) == 2 and all(w >= 0 for w in waits) and (not device_copies or waits == [0.0, 0.0])
