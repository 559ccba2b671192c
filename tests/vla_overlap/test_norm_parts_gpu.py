"""DistributedAdamW(norm_in_backward=True) on CUDA + NCCL at world size 1: the Triton sum-of-squares parts taken
on the comm stream during the backward give the norm of the pass after the backward bit for bit, eagerly and
from a replayed CUDA graph (whose replays refresh the parts). Run on a GPU host: `pytest -m gpu`."""

from __future__ import annotations

import contextlib

import pytest
import torch
import torch.distributed as dist
import torch.nn.functional as F
from vla_overlap import DistributedAdamW, OverlapConfig, OverlapDataParallel, UpdateStream

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


def make() -> torch.nn.Module:
    torch.manual_seed(0)
    layers = [torch.nn.Linear(256, 256) for _ in range(6)]
    return torch.nn.Sequential(*layers).to("cuda", torch.bfloat16)


def test_parts_taken_in_the_backward_give_the_norm_after_it(nccl) -> None:
    runs = []
    for parts in (False, True):
        module = make()
        model = OverlapDataParallel(module, OverlapConfig(bucket_elements=70_000), process_group=nccl)
        opt = DistributedAdamW(model, lr=1e-3, flat="triton", norm_in_backward=parts)
        assert len(opt.flat.buckets) > 3
        updates, norms = UpdateStream("cuda"), []
        for step in range(3):
            model.zero_grad()
            for micro in range(2):
                g = torch.Generator(device="cuda").manual_seed(10 * step + micro)
                x = torch.randn(64, 256, device="cuda", generator=g, dtype=torch.bfloat16)
                sync = model.no_sync() if micro == 0 else contextlib.nullcontext()
                with sync:
                    F.mse_loss(model(x).float(), torch.zeros(64, 256, device="cuda")).backward()
            with updates.side():  # as the trainer runs it: the clip and the update on the side stream
                norms.append(opt.clip_grad_norm_(0.05).clone())
                opt.step()
            updates.wait()
            assert model._grads.after_reduce_ran_for_all == parts
        torch.cuda.synchronize()
        runs.append((norms, [p.detach().clone() for p in module.parameters()]))
    (norms, params), (norms_parts, params_parts) = runs
    assert norms[0] > 0.05  # the clip clips
    assert all(torch.equal(a, b) for a, b in zip(norms, norms_parts))
    assert all(torch.equal(a, b) for a, b in zip(params, params_parts))


def test_a_replayed_graph_refreshes_the_parts(nccl) -> None:
    module = make()
    config = OverlapConfig(bucket_elements=70_000, overwrite_first_grad=False)
    model = OverlapDataParallel(module, config, process_group=nccl)
    opt = DistributedAdamW(model, lr=1e-3, flat="triton", norm_in_backward=True)
    params = model.trainable_parameters()
    static = [torch.zeros_like(p) for p in params]

    def sync() -> None:
        model.zero_grad_buffer()
        for p, g in zip(params, static):
            p.main_grad.add_(g)
        model.start_grad_sync()
        model.finish_grad_sync()

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(2):
            sync()  # warm up NCCL and the allocator outside the capture
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, capture_error_mode="thread_local"):  # NCCL's watchdog thread may run
        sync()
    for trial in range(3):
        for i, g in enumerate(static):
            g.copy_(torch.randn_like(g.float()).mul_(trial + i).to(g.dtype))
        graph.replay()
        model.mark_grads_synced()
        from_parts = opt.clip_grad_norm_(float("inf")).clone()
        assert model._grads.after_reduce_ran_for_all
        after = opt.flat.grad_norm(2.0)
        torch.cuda.synchronize()
        assert from_parts > 0 and torch.equal(from_parts, after), trial
