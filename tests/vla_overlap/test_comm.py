"""The collective-name shim and the CPU behaviour of the device layer."""

from __future__ import annotations

import types

import pytest
import torch
import torch.distributed as dist
from vla_overlap._comm import CommStream, Communicator, first_available


def test_the_newest_collective_name_wins_and_old_ones_are_fallbacks() -> None:
    new, old, oldest = object(), object(), object()
    everything = types.SimpleNamespace(
        reduce_scatter_single=new, reduce_scatter_tensor=old, _reduce_scatter_base=oldest
    )
    names = ("reduce_scatter_single", "reduce_scatter_tensor", "_reduce_scatter_base")
    assert first_available(everything, *names) is new
    assert (
        first_available(types.SimpleNamespace(reduce_scatter_tensor=old, _reduce_scatter_base=oldest), *names)
        is old
    )
    assert first_available(types.SimpleNamespace(_reduce_scatter_base=oldest), *names) is oldest
    with pytest.raises(RuntimeError, match="none of"):
        first_available(types.SimpleNamespace(), *names)


def test_this_torch_has_a_name_for_every_collective_we_use() -> None:
    assert first_available(dist, "reduce_scatter_single", "reduce_scatter_tensor", "_reduce_scatter_base")
    assert first_available(dist, "all_gather_single", "all_gather_into_tensor", "_all_gather_base")


@pytest.mark.skipif(dist.is_initialized(), reason="a default process group exists in this process")
def test_a_clear_error_without_init_process_group() -> None:
    with pytest.raises(RuntimeError, match="init_process_group"):
        Communicator(None)


def test_comm_stream_is_a_no_op_on_cpu() -> None:
    stream = CommStream(torch.device("cpu"))
    with stream.launch():
        value = torch.ones(2) * 3
    stream.join()
    assert value.sum().item() == 6
