"""Checkpoint staging (CPU): the copies a save takes hold the state at the save step, bit for bit, however
training changes the originals afterwards; the host pool is reused by every save (same storage), its slots
each a storage of their own (a saved file holds the tensor, not the chunk around it). The same scenario on
CUDA, with the copies beside the next steps and the update on a side stream: test_staging_gpu.py."""

from __future__ import annotations

import importlib.util
import io
import sys
from pathlib import Path

import pytest
import torch
from gr00t_train.checkpoint import host_pool
from gr00t_train.checkpoint.host_pool import ALIGN, HostPool, nbytes
from gr00t_train.checkpoint.staging import Staging, expected_sizes
from torch import nn
from vla_overlap import DistributedAdamW, OverlapConfig, OverlapDataParallel


def _load_scenario():
    """The scenario shared with the other staging test file (tests are not a package)."""
    name = "gr00t_train_staging_scenario"
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, Path(__file__).with_name("_staging_scenario.py"))
        sys.modules[name] = module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
    return sys.modules[name]


stage_while_training = _load_scenario().stage_while_training


def test_staged_optimizer_state_is_the_state_at_the_save_step(env) -> None:
    result = stage_while_training(torch.device("cpu"), width=16, saves=3)
    first, *later = result["saves"]
    assert result["entries"] == 4 * 4  # two linears' weight and bias: master, two moments, step
    assert result["update_wait_s"] == [0.0] * 3  # on CPU the copies are done when the save returns
    for save in result["saves"]:
        assert save["equal"] and save["changed"] and save["groups"]
    for save in later:  # the pool is reused: the same places, nothing allocated
        assert save["addresses"] == first["addresses"] and save["grown"] == 0
        assert save["capacity"] == first["capacity"]


def test_pool_slots_are_storages_of_their_own_and_reused_in_order() -> None:
    pool = HostPool(pinned=False)
    pool.reserve(1 << 20)
    assert pool.capacity == 1 << 20
    shapes = [((3, 5), torch.float32), ((7,), torch.bfloat16), ((), torch.int64), ((0, 4), torch.float32)]
    pool.rewind()
    slots = [pool.take(shape, dtype) for shape, dtype in shapes]
    assert [(tuple(s.shape), s.dtype) for s in slots] == [(tuple(shape), dtype) for shape, dtype in shapes]
    assert pool.grown == 0
    for slot in slots:
        assert slot.untyped_storage().nbytes() == slot.numel() * slot.element_size()
        if slot.numel():  # an empty tensor has no address
            assert slot.data_ptr() % ALIGN == slots[0].data_ptr() % ALIGN  # page-aligned in its chunk
    for a, b in zip(slots, slots[1:]):
        if a.numel() and b.numel():
            assert a.data_ptr() + a.numel() * a.element_size() <= b.data_ptr()
    slots[0].copy_(torch.arange(15.0).view(3, 5))
    buffer = io.BytesIO()
    torch.save({"a": slots[0]}, buffer)
    assert len(buffer.getvalue()) < 4096  # 60 bytes of data, not the 1 MiB chunk around them
    buffer.seek(0)
    assert torch.equal(torch.load(buffer, weights_only=True)["a"], torch.arange(15.0).view(3, 5))
    pool.rewind()
    again = [pool.take(shape, dtype) for shape, dtype in shapes]
    assert [s.data_ptr() for s in again] == [s.data_ptr() for s in slots]
    big = pool.take((1 << 19,), torch.float32)  # 2 MiB: more than the reservation holds
    assert pool.grown >= 2 << 20 and big.untyped_storage().nbytes() == 2 << 20
    pool.close()
    assert pool.capacity == 0
    assert torch.equal(again[0], torch.arange(15.0).view(3, 5))  # a slot in use outlives close()


def test_background_reservation_is_waited_for_by_the_first_save() -> None:
    staging = Staging(torch.device("cpu"))
    staging.pool.reserve_in_background([3 << 20])
    staging.begin()  # waits for the reservation: the save then takes from it
    assert staging.pool.capacity >= 3 << 20 and staging.pool.reserve_s is not None
    staged = staging.copy({"w": torch.ones(1000)})
    staging.finish()()
    assert staging.pool.grown == 0 and torch.equal(staged["w"], torch.ones(1000))
    staging.close()


@pytest.mark.parametrize("moments", ["fp32", "int8"])
def test_the_reservation_expects_the_staged_sizes_in_the_order_they_are_staged(
    env, monkeypatch, moments
) -> None:
    """Chunks are sized to their slots, so a reservation planned in another order than the save's leaves a
    slot without a chunk big enough: the first save of n1.6-3b then pinned 3.3 s of memory inside its stall
    (ZeRO-1's param_groups follow the buckets, its state dict the parameters)."""
    monkeypatch.setattr(host_pool, "CHUNK_BYTES", 1 << 12)  # every tensor here over a quarter of a chunk
    torch.manual_seed(0)
    module = nn.Sequential(nn.Linear(32, 128), nn.GELU(), nn.Linear(128, 64)).to(torch.bfloat16)
    model = OverlapDataParallel(module, OverlapConfig(bucket_elements=32 * 128))
    opt = DistributedAdamW(model, lr=1e-2, flat="auto", moments=moments)
    expected = expected_sizes(opt)
    for _ in range(2):
        opt.zero_grad()
        x = torch.randn(8, 32, dtype=torch.bfloat16)
        model(x).float().square().mean().backward()
        opt.step()
    staging = Staging(torch.device("cpu"))
    staging.pool.reserve_for(expected)
    staged_sizes, take = [], staging.pool.take
    monkeypatch.setattr(
        staging.pool,
        "take",
        lambda shape, dtype: staged_sizes.append(nbytes(shape, dtype)) or take(shape, dtype),
    )
    staging.begin()
    staging.copy(opt.state_dict(on_device=True, encoded_moments=True)["state"], guarded=True)
    staging.finish()()
    assert staged_sizes == expected
    assert staging.pool.grown == 0
    staging.close()


def test_a_run_registers_its_update_hook_and_frees_the_pool_at_the_end(tmp_path, env, standins) -> None:
    from gr00t_train import Trainer

    cfg = standins.small_config(tmp_path, steps=4, checkpoint__every=2)
    trainer = Trainer(cfg, standins.make_parts(), env)
    hooks = trainer.model.optimizer._optimizer_step_pre_hooks
    steps_with_hook = []
    trainer.step_callback = lambda: steps_with_hook.append(len(hooks))
    trainer.fit()
    assert steps_with_hook == [1] * 4  # the updates wait for a save's copies while the run lasts
    assert len(hooks) == 0 and trainer.checkpoint.staging.pool.capacity == 0  # released at the end
    assert trainer.checkpoint.staging.update_wait_s == [0.0, 0.0]  # one per save (CPU: no wait)


def test_the_staging_memory_is_reserved_once_the_first_step_has_ended(tmp_path, env, standins) -> None:
    """Pinning a save's host memory holds the CUDA driver: at the run's start it held up the data pipeline's
    first batch (11 s for n1.6-3b on an H200), beside the first step its graph capture (15 s). The reservation
    starts after the first step, once per run."""
    from gr00t_train import Trainer

    cfg = standins.small_config(tmp_path, steps=3, checkpoint__every=2)
    trainer = Trainer(cfg, standins.make_parts(), env)
    events = []
    next_step, train_step, pool = trainer.data.next_step, trainer.train_step, trainer.checkpoint.staging.pool
    reserve = pool.reserve_in_background

    def logged_next_step(*args, **kwargs):
        batch = next_step(*args, **kwargs)
        events.append("batch")
        return batch

    def logged_train_step(*args, **kwargs):
        out = train_step(*args, **kwargs)
        events.append("step")
        return out

    def logged_reserve(sizes):
        events.append("reserve")
        reserve(sizes)

    trainer.data.next_step, trainer.train_step = logged_next_step, logged_train_step
    pool.reserve_in_background = logged_reserve
    trainer.fit()
    assert events == ["batch", "step", "reserve", "batch", "step", "batch", "step"]
