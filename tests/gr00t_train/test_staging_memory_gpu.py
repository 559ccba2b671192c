"""Device memory of checkpoint saves on CUDA (run on a GPU host: `pytest tests/gr00t_train/test_staging_memory_gpu.py
-m gpu`): with the cyclic collector off, saves that copy the state on the device first hold one snapshot buffer
between them, the same one every save (allocated once), and nothing else; `close` gives it back. The peak
recorded per save is the memory before it plus that one buffer."""

from __future__ import annotations

import gc

import pytest
import torch
from gr00t_train.checkpoint.staging import Staging

pytestmark = pytest.mark.gpu


def test_saves_hold_one_snapshot_buffer_reused_and_freed_at_close() -> None:
    device = torch.device("cuda")
    state = {f"p{i}": {"master": torch.randn(1 << 22, device=device), "exp_avg": torch.randn(1 << 22, device=device)}
             for i in range(4)}  # fmt: skip
    size = sum(t.numel() * t.element_size() for entry in state.values() for t in entry.values())  # 128 MiB
    torch.cuda.synchronize()
    gc.collect()
    gc.disable()
    try:
        base = torch.cuda.memory_allocated(device)
        staging = Staging(device, device_copies=True)
        pointers = []
        for _ in range(3):
            staging.begin()
            staged = staging.copy(state, guarded=True)
            staging.finish()()
            assert staging.snapshot_bytes == size
            assert torch.equal(staged["p3"]["exp_avg"], state["p3"]["exp_avg"].cpu())
            pointers.append(staging.snapshot._buffer.data_ptr())
            # the buffer kept for the next save, nothing more (a cycle would keep one more per save)
            assert torch.cuda.memory_allocated(device) == base + size
            memory = staging.memory
            assert memory["snapshot"] * (1 << 30) == size
            assert memory["peak_after"] >= memory["allocated_before"] + size / (1 << 30) - 1e-9
            for entry in state.values():  # training goes on
                for tensor in entry.values():
                    tensor.add_(1.0)
        assert pointers == [pointers[0]] * 3
        staging.close()
        assert torch.cuda.memory_allocated(device) == base
    finally:
        gc.enable()
