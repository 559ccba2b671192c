"""DistributedAdamW.state_dict(on_device=True) and state_dict(keep=...): the same state as the CPU state dict,
bit for bit, at one rank and two, with torch's AdamW and with the flat step. At one rank nothing is gathered:
the on-device entries are the optimizer's own buffers (the next step changes them, which is why a caller
copies them before it runs), while the CPU entries are copies, each in a storage of its own (a saved file
holds each tensor, not the buckets around it)."""

from __future__ import annotations

import pytest
import torch


@pytest.mark.parametrize("flat", [None, "torch"], ids=["torch-adamw", "flat"])
@pytest.mark.parametrize("world_size", [1, 2])
def test_the_state_on_the_device_is_the_state(pool, world_size: int, flat: str | None) -> None:
    for result in pool.run("state_on_device", world_size, flat=flat):
        on_cpu, on_device = result["on_cpu"], result["on_device"]
        assert set(on_device) == set(on_cpu) and result["groups_equal"] and result["own_storage"]
        assert {key for _, key in on_cpu} == {"master", "exp_avg", "exp_avg_sq", "step"}
        for k, value in on_cpu.items():
            assert torch.equal(on_device[k], value), k
            assert torch.equal(result["through_keep"][k], value), k
        tensors = [k for k in on_cpu if k[1] != "step"]  # step counts are always fresh CPU scalars
        changed = [k for k in tensors if not torch.equal(result["after_a_step"][k], on_device[k])]
        if world_size == 1:
            assert all(result["aliases"][k] for k in tensors)
            assert changed == tensors  # the live buffers moved on with the next step
            assert result["masters_in_order"] == result["state_masters"]
            # param_groups follow the buckets, another order: masters_in_order is not theirs renamed
            assert sorted(result["param_groups_order"]) == sorted(result["masters_in_order"])
            assert result["param_groups_order"] != result["masters_in_order"]
        else:
            assert not any(result["aliases"][k] for k in tensors) and changed == []
