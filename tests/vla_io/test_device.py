"""Level 3: copies straight from registered (pinned) worker arenas, and their memory is handed back only
after the GPU has read it."""

from __future__ import annotations

import pytest
import torch
from vla_io import LeRobotDataset, Pipeline
from vla_io.pipeline.level3_device import HostToDevice


def test_on_cpu_release_comes_at_once_and_shared_tensors_are_cloned():
    h2d = HostToDevice(torch.device("cpu"), 2)
    shared = torch.arange(6).share_memory_()
    released = []
    out, event = h2d.copy({"x": shared}, private=True, release=lambda: released.append(1))
    assert event is None and released == [1]
    assert torch.equal(out["x"], shared) and out["x"].data_ptr() != shared.data_ptr()
    assert h2d.pin(shared.untyped_storage()) is False  # nothing to page-lock without a GPU


@pytest.mark.gpu
def test_direct_copies_from_pinned_memory_release_after_the_gpu_read_them():
    h2d = HostToDevice(torch.device("cuda", torch.cuda.current_device()), 2)
    h2d.bind_thread()
    host = torch.arange(1 << 20, dtype=torch.int32).share_memory_()
    assert h2d.pin(host.untyped_storage()) and h2d.pin_failed is None
    released = []
    out, event = h2d.copy({"x": host}, private=True, release=lambda: released.append(1))
    h2d.poll(block=True)
    assert released == [1]
    event.synchronize()
    assert torch.equal(out["x"].cpu(), host)
    assert not h2d._slots[0] and not h2d._slots[1]  # no staging buffer was used
    h2d.unpin(host.untyped_storage())
    assert not h2d._pinned


@pytest.mark.gpu
def test_pipeline_copies_from_the_workers_arenas_and_matches_the_reference(synth_root, batches_equal):
    ds = LeRobotDataset(synth_root("v2.1", "av1"), delta_timestamps={"action": [0.0, 0.05]}, progress=False)
    ref = list(Pipeline(ds, 4, synchronous=True, device="cuda", seed=3))
    with Pipeline(ds, 4, num_workers=2, seed=3, device="cuda") as pipe:
        got = list(pipe) + list(pipe)  # the second epoch reuses (and rewrites) the same arenas
        producer = pipe._producer
        assert producer is not None and producer.h2d._pinned, "the arenas were not page-locked"
    assert not producer.h2d._pinned and not producer.h2d._pending  # unpinned and released at close
    assert len(got) == 2 * len(ref)
    for a, b in zip(ref, got):  # every batch was kept: none was overwritten by a worker
        batches_equal(a, b)
