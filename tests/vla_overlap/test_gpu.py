"""CUDA + NCCL at world size 1 (run on a GPU host: `pytest tests/vla_overlap -m gpu`).

World size 1 exercises the real NCCL code paths (collectives issued from the side stream, waited on,
reduce-scatter and all-gather in place) without needing several GPUs; every collective is then an
identity, so results can be compared with plain single-GPU training.
"""

from __future__ import annotations

import contextlib
import itertools

import pytest
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from vla_overlap import DistributedAdamW, OverlapConfig, OverlapDataParallel

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


class Net(nn.Module):
    def __init__(self, d: int = 256, depth: int = 4) -> None:
        super().__init__()
        self.layers = nn.ModuleList(
            nn.Sequential(nn.LayerNorm(d), nn.Linear(d, 4 * d), nn.GELU(), nn.Linear(4 * d, d))
            for _ in range(depth)
        )
        self.head = nn.Linear(d, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for layer in self.layers:
            x = x + layer(x)
        return self.head(x)


def make(dtype: torch.dtype = torch.float32) -> Net:
    torch.manual_seed(0)
    return Net().to("cuda", dtype)


def data(step: int, micro: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator(device="cuda").manual_seed(100 * step + micro)
    return torch.randn(32, 256, device="cuda", generator=g), torch.randn(32, 8, device="cuda", generator=g)


def train(
    model: nn.Module, opt: torch.optim.Optimizer, steps: int = 3, micro: int = 2, no_sync: bool = True
) -> None:
    for step in range(steps):
        model.zero_grad()
        for m in range(micro):
            x, y = data(step, m)

            # A fresh context manager for each `with`: generator-based ones cannot be entered twice.
            def sync(m: int = m) -> contextlib.AbstractContextManager:
                return model.no_sync() if no_sync and m < micro - 1 else contextlib.nullcontext()

            with sync(), torch.autocast("cuda", dtype=torch.bfloat16):
                loss = F.mse_loss(model(x.to(next(model.parameters()).dtype)).float(), y) / micro
            with sync():
                loss.backward()
        opt.step()
    torch.cuda.synchronize()


def test_overlap_equals_single_gpu_training_bitwise(nccl) -> None:
    reference = make()
    train(reference, torch.optim.AdamW(reference.parameters(), lr=1e-3, fused=True), no_sync=False)
    module = make()
    model = OverlapDataParallel(module, OverlapConfig(bucket_elements=100_000), process_group=nccl)
    assert len(model.layout.buckets) > 3
    train(model, torch.optim.AdamW(model.trainable_parameters(), lr=1e-3, fused=True))
    for (name, a), b in zip(module.named_parameters(), reference.parameters()):
        assert torch.equal(a, b), name


@pytest.mark.parametrize("gather_overlap", [True, False])
def test_zero1_bf16_parameters_follow_fused_fp32_master_weights(nccl, gather_overlap: bool) -> None:
    reference = make(torch.bfloat16)
    masters = [p.detach().float().clone() for p in reference.parameters()]
    ref_opt = torch.optim.AdamW(masters, lr=1e-3, fused=True)
    for step in range(3):
        acc = [torch.zeros_like(m) for m in masters]
        for m in range(2):
            x, y = data(step, m)
            with torch.autocast("cuda", dtype=torch.bfloat16):
                loss = F.mse_loss(reference(x.bfloat16()).float(), y) / 2
            loss.backward()
            for a, p in zip(acc, reference.parameters()):
                a.add_(p.grad)
                p.grad = None
        for a, master in zip(acc, masters):
            master.grad = a
        ref_opt.step()
        with torch.no_grad():
            for p, master in zip(reference.parameters(), masters):
                p.copy_(master)
    module = make(torch.bfloat16)
    config = OverlapConfig(bucket_elements=100_000, overlap_param_gather=gather_overlap)
    model = OverlapDataParallel(module, config, process_group=nccl)
    opt = DistributedAdamW(model, lr=1e-3)
    assert opt.inner.defaults["fused"] is True
    train(model, opt)
    saved = opt.state_dict()
    for (name, p), master, ref in zip(module.named_parameters(), masters, reference.parameters()):
        # Same elementwise fused AdamW; only the kernel's tensor grouping differs.
        torch.testing.assert_close(
            saved["state"][name]["master"], master.cpu(), atol=1e-6, rtol=1e-5, msg=name
        )
        torch.testing.assert_close(p.float(), ref.float(), atol=1e-5, rtol=2**-7, msg=name)  # <= 1 bf16 ulp


@pytest.mark.parametrize("sharded", [False, True])
def test_explicit_grad_sync_is_capturable_in_a_cuda_graph(nccl, sharded: bool) -> None:
    """What a full-iteration graph replayer does: zero the buffers, accumulate into main_grad, reduce."""
    module = make()
    # it adds into main_grad itself: buffers zeroed at each step's start
    config = OverlapConfig(bucket_elements=100_000, overwrite_first_grad=False)
    model = OverlapDataParallel(module, config, process_group=nccl)
    if sharded:
        DistributedAdamW(model, lr=1e-3)
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
    for trial in range(2):
        for i, g in enumerate(static):
            g.copy_(torch.full_like(g, float(trial + i)))
        graph.replay()
        torch.cuda.synchronize()
        for p, g in zip(params, static):
            assert torch.equal(p.main_grad, g)  # world size 1: the mean is the value itself


def test_update_stream_fence_holds_back_a_replayed_graph() -> None:
    """Work on the side stream (slowed down on purpose) is finished before a graph that waits on the fence
    reads its result: the wait is captured as an event-wait node and honours records made after capture."""
    from vla_overlap import UpdateStream

    updates = UpdateStream("cuda")
    x = torch.zeros(1 << 20, device="cuda")
    y = torch.zeros_like(x)

    def read() -> None:
        updates.wait()
        y.copy_(x * 2)

    with updates.side():
        x.fill_(0.0)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        read()  # warm up outside the capture
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        read()
    for value in (1.0, 2.0, 3.0):
        with updates.side():
            torch.cuda._sleep(20_000_000)  # tens of milliseconds: a missing wait would read the old x
            x.fill_(value)
        graph.replay()
        torch.cuda.synchronize()
        assert torch.all(y == 2 * value), value


_RAGGED = [(0, 2 * 1024 + 100, 0), (2 * 1024 + 100, 2 * 1024 + 1000, 1), (2 * 1024 + 1064, 3 * 1024 + 123, 0)]
_ALIGNED = [
    (0, 2 * 1024 + 100, 0),
    (2 * 1024 + 128, 2 * 1024 + 1000, 1),
    (2 * 1024 + 1024, 3 * 1024 + 123, 0),
]


@pytest.mark.parametrize("with_idle", [False, True], ids=["all-stepped", "idle-blocks"])
@pytest.mark.parametrize(
    ("runs", "length", "align"), [(_RAGGED, 3 * 1024 + 123, 1), (_ALIGNED, 3 * 1024 + 128, 64)]
)
def test_flat_adamw_triton_kernel_equals_its_torch_arithmetic(
    runs, length: int, align: int, with_idle
) -> None:
    """The Triton kernel of DistributedAdamW's flat step vs the same arithmetic in torch ops, on random flat
    buffers: runs of two table rows (one longer than a block, one ragged), gaps between runs (padding),
    clipping and a bf16 copy. Ragged runs: blocks follow them exactly and random padding is left untouched.
    Aligned runs (as the layout places parameters): blocks widen over the zero padding, which stays zero.
    Tolerance: the kernel may fuse multiply-adds (one rounding instead of two) where torch rounds twice, a
    few fp32 ulps after one step. With idle blocks (rows that never had a gradient, FlatAdamW.track_rows),
    those blocks hold zero gradients and moments and only decay: row 0's factor < 1 (the same single multiply
    in both), row 1's factor 1 (the kernel writes nothing; the bf16 copy already equals the master)."""
    from vla_overlap._flat_adamw import BLOCK, plan_blocks
    from vla_overlap._flat_adamw_steps import torch_step, triton_step

    assert BLOCK == 1024
    blocks, planned_align = plan_blocks(runs, length)
    assert planned_align == align
    gaps = torch.ones(length, dtype=torch.bool, device="cuda")
    for start, end, _ in runs:
        gaps[start:end] = False
    flats = []
    for _ in range(2):
        g = torch.Generator(device="cuda").manual_seed(1)
        flat = {key: torch.randn(length, generator=g, device="cuda") for key in ("master", "grad", "exp_avg")}
        flat["exp_avg_sq"] = torch.rand(length, generator=g, device="cuda")
        if align > 1:  # the layout's padding: zero everywhere
            for key in ("master", "grad", "exp_avg", "exp_avg_sq"):
                flat[key][gaps] = 0
        flat["out"] = flat["master"].bfloat16()  # the invariant the step keeps
        flat["runs"], flat["blocks"], flat["align"] = runs, torch.tensor(blocks, device="cuda"), align
        flats.append(flat)
    idle = None
    if with_idle:
        idle = torch.arange(len(blocks), device="cuda") % 3 == 1
        for flat in flats:
            for (start, size, _), skip in zip(blocks, idle.tolist()):
                if skip:
                    for key in ("grad", "exp_avg", "exp_avg_sq"):
                        flat[key][start : start + size] = 0
    before, out_before = flats[1]["master"].clone(), flats[1]["out"].clone()
    table = torch.tensor([[1 - 1e-3 * 0.1, 0.9, 0.999, 1e-8, 1e-3 / 0.1, (1 - 0.999) ** 0.5, 0, 0],
                          [1.0, 0.8, 0.99, 1e-6, 2e-3 / 0.2, (1 - 0.99) ** 0.5, 0, 0]], device="cuda")  # fmt: skip
    coef = torch.tensor(0.5, device="cuda")
    torch_step(flats[0], table, coef, idle)
    triton_step(flats[1], table, coef, idle)
    for key in ("master", "exp_avg", "exp_avg_sq"):
        torch.testing.assert_close(flats[1][key], flats[0][key], rtol=2e-6, atol=1e-7, msg=key)
        assert torch.equal(flats[1][key][gaps], flats[0][key][gaps]), key  # padding: untouched, or zero
    assert torch.equal(flats[1]["master"][gaps], before[gaps])
    assert torch.equal(flats[1]["out"][gaps], out_before[gaps])
    assert torch.equal(flats[1]["out"][~gaps], flats[1]["master"][~gaps].bfloat16())
    assert not torch.equal(flats[1]["master"][~gaps], before[~gaps])
    if with_idle:
        for (start, size, row), skip in zip(blocks, idle.tolist()):
            window = slice(start, start + size)
            if skip:  # decay only: bitwise torch's multiply; moments stay zero
                assert torch.equal(flats[1]["master"][window], flats[0]["master"][window])
                assert not flats[1]["exp_avg_sq"][window].any()
                assert torch.equal(flats[1]["master"][window], before[window]) == (row == 1)


@pytest.mark.parametrize("with_idle", [False, True], ids=["all-stepped", "idle-blocks"])
def test_flat_adamw_triton_kernel_with_remainders_steps_as_the_plain_kernel(with_idle: bool) -> None:
    """DistributedAdamW(remainders=True)'s kernel path: the master read from and written as bf16 parameter +
    16-bit remainder, against the plain kernel from the same state. The same arithmetic, so the moments are
    bitwise equal and so are the parameters (the plain kernel's bf16 cast rounds to nearest even, as the
    encoder does); the decoded masters equal the plain ones except at exact rounding ties, moved one ulp.
    2^22 elements: about 64 ties among the outputs."""
    from vla_overlap._flat_adamw import plan_blocks
    from vla_overlap._flat_adamw_steps import triton_step
    from vla_overlap._remainders import decode, encode_

    length = 1 << 22
    runs = [(0, length // 2, 0), (length // 2, length, 1)]
    blocks, align = plan_blocks(runs, length)
    g = torch.Generator(device="cuda").manual_seed(3)
    base = {key: torch.randn(length, generator=g, device="cuda") * 0.05 for key in ("master", "exp_avg")}
    base["grad"] = (torch.randn(length, generator=g, device="cuda") * 0.01).bfloat16()
    base["exp_avg_sq"] = torch.rand(length, generator=g, device="cuda") * 1e-4
    base["out"] = torch.empty(length, dtype=torch.bfloat16, device="cuda")
    base["rem"] = torch.empty(length, dtype=torch.int16, device="cuda")
    encode_(base["master"], base["out"], base["rem"])  # both start from the same (decodable) masters
    idle = torch.arange(len(blocks), device="cuda") % 4 == 3 if with_idle else None
    flats = [{key: value.clone() for key, value in base.items()} for _ in range(2)]
    flats[0]["rem"] = None
    for flat in flats:
        flat["runs"], flat["blocks"], flat["align"] = runs, torch.tensor(blocks, device="cuda"), align
        if idle is not None:
            for (start, size, _), skip in zip(blocks, idle.tolist()):
                if skip:
                    for key in ("grad", "exp_avg", "exp_avg_sq"):
                        flat[key][start : start + size] = 0
    table = torch.tensor([[1 - 1e-4, 0.9, 0.999, 1e-8, 1e-3 / 0.1, (1 - 0.999) ** 0.5, 0, 0],
                          [1 - 1e-3, 0.8, 0.99, 1e-6, 2e-3 / 0.2, (1 - 0.99) ** 0.5, 0, 0]], device="cuda")  # fmt: skip
    coef = torch.tensor(0.5, device="cuda")
    for flat in flats:
        triton_step(flat, table, coef, idle)
    plain, kept = flats
    assert torch.equal(kept["master"], base["master"])  # not read or written with remainders
    for key in ("exp_avg", "exp_avg_sq", "out"):
        assert torch.equal(kept[key], plain[key]), key
    bits = plain["master"].view(torch.int32)
    ties = (bits & 0xFFFF) == 0x8000
    moved = (decode(kept["out"], kept["rem"]).view(torch.int32).long() - bits.long()).abs()
    assert int(ties.sum()) > 0 and bool((moved[ties] == 1).all()) and bool((moved[~ties] == 0).all())


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_sum_of_squares_kernel_matches_a_float64_sum(dtype: torch.dtype) -> None:
    """The clipping norm's kernel against the sum in float64, on sizes off its block: fp32 partial sums of
    about 32768 squares each, then a sum of the partials, stay within 1e-5 of the exact value (each of the
    ~log2(n) levels of rounding adds at most 2^-24 relative; 1e-5 leaves a wide margin)."""
    from vla_overlap._flat_adamw_kernel import sum_of_squares

    gen = torch.Generator(device="cuda").manual_seed(0)
    for n in (1, 4095, 4096 * 3 + 17, 4096 * 8 * 5 + 3, 10_000_019):
        x = torch.randn(n, generator=gen, device="cuda").to(dtype)
        ours = sum_of_squares(x)
        exact = x.double().square().sum()
        assert ours.dtype == torch.float32
        torch.testing.assert_close(ours.double(), exact, rtol=1e-5, atol=0)
    assert sum_of_squares(torch.zeros(0, device="cuda")).item() == 0


@pytest.mark.parametrize("narrow", [torch.bfloat16, torch.float16])
def test_cast_kernel_equals_torch_bitwise(narrow: torch.dtype) -> None:
    """The Triton cast kernel (gradient copies and adds into fp32 buffers, or buffers of the gradient's own
    dtype) gives torch's copy_/add_ results bit for bit: widening is exact and an add rounds once, from fp32 to
    the buffer's dtype, in both; sizes off the block and a non-contiguous fallback included."""
    from vla_overlap._cast_kernel import _kernel_applies, cast_into

    gen = torch.Generator(device="cuda").manual_seed(0)
    for n, buffer in itertools.product((1, 2047, 2048 * 3 + 5, 1_000_003), (torch.float32, narrow)):
        source = torch.randn(n, generator=gen, device="cuda").mul_(100).to(narrow)
        start = torch.randn(n, generator=gen, device="cuda").to(buffer)
        for add in (False, True):
            ours, theirs = start.clone(), start.clone()
            assert _kernel_applies(ours, source)
            cast_into(ours, source, add=add)
            theirs.add_(source) if add else theirs.copy_(source)
            assert torch.equal(ours, theirs), (n, buffer, add)
    strided = torch.zeros(64, 2, device="cuda")[:, 0]
    source = torch.randn(64, device="cuda").to(narrow)
    assert not _kernel_applies(strided, source)
    cast_into(strided, source)
    assert torch.equal(strided, source.float())


def test_staged_update_holds_each_layer_back_until_its_stage_is_stepped(nccl) -> None:
    """stage_update with the Triton step on an UpdateStream: a reader on the compute stream that waits for
    stage k (while the update, slowed down on purpose, is still running) copies layer k's parameters after
    their step; and the staged step equals the one-pass step bit for bit (the same kernel on the same blocks,
    in another order and more launches)."""
    from vla_overlap import UpdateStream

    runs = []
    for staged in (False, True):
        module = make(torch.bfloat16)
        model = OverlapDataParallel(module, OverlapConfig(bucket_elements=100_000), process_group=nccl)
        opt = DistributedAdamW(model, lr=1e-3, flat="triton")
        updates = UpdateStream("cuda")
        if staged:  # unstaged, wait_stage(k) waits for the whole update
            assert opt.stage_update([list(layer.parameters()) for layer in module.layers], updates)
        for step in range(3):
            model.zero_grad()
            x, y = data(step, 0)
            F.mse_loss(model(x.bfloat16()).float(), y).backward()
            with updates.side():
                opt.clip_grad_norm_(0.05)
                torch.cuda._sleep(20_000_000)  # tens of milliseconds: a missing wait would copy old weights
                opt.step()
            copies = []
            for k, layer in enumerate(module.layers, start=1):
                updates.wait_stage(k)
                copies.append([p.detach().clone() for p in layer.parameters()])
            updates.wait()
            torch.cuda.synchronize()
            for layer, copy in zip(module.layers, copies):
                assert all(torch.equal(a, p) for a, p in zip(copy, layer.parameters())), (staged, step)
        runs.append([p.detach().clone() for p in module.parameters()])
    assert all(torch.equal(a, b) for a, b in zip(*runs))
