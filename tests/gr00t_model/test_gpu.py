"""GPU only: one full training step (forward, backward, AdamW) captured in a CUDA graph and replayed."""

from __future__ import annotations

import pytest
import torch
from gr00t_model import GR00TN16, GR00TConfig, make_dummy_batch

pytestmark = pytest.mark.gpu


BF16 = {"frozen_dtype": "bfloat16", "compute_dtype": "bfloat16"}  # the release policy (tiny defaults to fp32)


def _setup(config: GR00TConfig, batch_size: int = 4):
    torch.manual_seed(0)
    with torch.device("cuda"):
        model = GR00TN16(config).train()
    params = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(params, lr=1e-4, capturable=True)
    batch = make_dummy_batch(config, batch_size, num_images=2, device="cuda")
    return model, optimizer, batch


def _capture(step):
    """Warm up on a side stream (allocates grads and optimizer state), then capture one call of `step`."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):
            step()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = step()
    return graph, out


def test_captured_training_step_matches_eager() -> None:
    config = GR00TConfig.preset(
        "tiny", dit_dropout=0.0, **BF16
    )  # no dropout: replay and eager are comparable
    model, optimizer, batch = _setup(config)
    horizon, dims = config.action_horizon, config.max_action_dim
    noise = torch.randn(4, horizon, dims, device="cuda")
    t = torch.rand(4, device="cuda") * config.noise_s

    def step():
        optimizer.zero_grad(set_to_none=False)
        loss = model(batch, noise=noise, t=t)["loss"]
        loss.backward()
        optimizer.step()
        return loss

    graph, static_loss = _capture(step)
    for seed in range(1, 4):
        fresh = make_dummy_batch(config, 4, num_images=2, seed=seed, device="cuda")
        for key, value in fresh.items():
            batch[key].copy_(value)
        noise.copy_(torch.randn_like(noise))
        t.copy_(torch.rand_like(t) * config.noise_s)
        before = {n: p.detach().clone() for n, p in model.named_parameters() if p.requires_grad}
        with torch.no_grad():
            eager_loss = model(batch, noise=noise, t=t)["loss"]
        graph.replay()
        torch.cuda.synchronize()
        assert torch.isfinite(static_loss)
        torch.testing.assert_close(static_loss, eager_loss, rtol=2e-3, atol=2e-4)
        changed = [
            n for n, p in model.named_parameters() if p.requires_grad and not torch.equal(p, before[n])
        ]
        assert len(changed) > 0.9 * len(before)


# "mid": the release's widths and head dims (real SDPA kernels, unaligned VL length 204) with few layers.
MID = {"vision_num_layers": 2, "llm_num_layers": 2, "tune_top_llm_layers": 1, "dit_num_layers": 4}


@pytest.mark.parametrize(("preset", "overrides"), [("tiny", BF16), ("n1.6-3b", MID)])
def test_captured_step_draws_fresh_randomness_each_replay(preset, overrides) -> None:
    config = GR00TConfig.preset(
        preset, **overrides
    )  # dropout 0.2; noise and flow time drawn inside the graph
    model, optimizer, batch = _setup(config)

    def step():
        optimizer.zero_grad(set_to_none=False)
        loss = model(batch)["loss"]
        loss.backward()
        optimizer.step()
        return loss

    graph, static_loss = _capture(step)
    losses = []
    for _ in range(5):
        graph.replay()
        losses.append(static_loss.item())
    assert all(torch.isfinite(torch.tensor(losses))) and len(set(losses)) == len(losses)


def test_bf16_precision_policy_on_gpu() -> None:
    config = GR00TConfig.preset("tiny", **BF16)
    model, optimizer, batch = _setup(config)
    loss = model(batch)["loss"]
    loss.backward()
    assert loss.dtype == torch.float32 and torch.isfinite(loss)
    for name, param in model.named_parameters():
        assert param.dtype == (torch.float32 if param.requires_grad else torch.bfloat16), name
        assert (param.grad is not None) == param.requires_grad, name
    actions = model.eval().get_action(batch)
    assert (
        actions.shape == (4, config.action_horizon, config.max_action_dim) and torch.isfinite(actions).all()
    )


def test_image_preprocessing_on_gpu_matches_cpu() -> None:
    from gr00t_model import ImageSpec, preprocess_images

    frames = torch.randint(0, 256, (2, 2, 3, 256, 256), dtype=torch.uint8)
    spec = ImageSpec(size=(252, 252))
    cpu = preprocess_images(frames, spec)
    gpu = preprocess_images(frames.cuda(), spec)
    assert gpu.device.type == "cuda"
    torch.testing.assert_close(gpu.cpu(), cpu, atol=2e-3, rtol=0)


def test_bf16_matmul_weights_and_the_frozen_prefix_compute_what_autocast_computes() -> None:
    """On the GPU, as on the CPU (test_fast_paths.py): bf16 Linear weights give the forward and gradients of
    fp32 weights under autocast bitwise (the same cuBLAS kernels on the same bf16 values), and resuming the
    forward from the frozen prefix changes nothing."""
    config = GR00TConfig.preset("tiny", **BF16)
    with torch.device("cuda"):
        torch.manual_seed(0)
        fp32 = GR00TN16(config).train()
        bf16 = GR00TN16(config.replace(trainable_dtype="bfloat16")).train()
    with torch.no_grad():
        for p, q in zip(bf16.parameters(), fp32.parameters()):
            p.copy_(q)
    batch = make_dummy_batch(config, 4, num_images=2, device="cuda")
    noise = torch.randn(4, config.action_horizon, config.max_action_dim, device="cuda")
    t = torch.rand(4, device="cuda") * 0.999
    results = []
    for model, prefix in ((fp32, False), (bf16, False), (bf16, True)):
        model.action_head.model.eval()  # no dropout: the three runs must draw nothing
        model.zero_grad(set_to_none=True)
        loss = model(batch, noise=noise, t=t, prefix=model.frozen_prefix(batch) if prefix else None)["loss"]
        loss.backward()
        results.append((loss.detach(), [p.grad.float() for p in model.parameters() if p.requires_grad]))
    for loss, grads in results[1:]:
        assert torch.equal(loss, results[0][0])
        assert all(torch.equal(a, b) for a, b in zip(grads, results[0][1]))


def test_dit_self_attention_on_the_efficient_kernel_is_as_close_to_fp64_as_sdpas_pick() -> None:
    # The DiT's self-attention blocks run on SDPA's memory-efficient kernel (_dit.self_attention), not
    # the backend SDPA would pick: its output and gradients must be as close to an fp64 reference.
    from gr00t_model._dit import Attention
    from torch.nn.attention import SDPBackend, sdpa_kernel

    torch.manual_seed(0)
    attn = Attention(1536, 32, 48, 0.0, None).cuda()
    x = torch.randn(16, 51, 1536, device="cuda")

    def run(dtype, backends=None):
        layer = Attention(1536, 32, 48, 0.0, None).to("cuda", dtype)
        layer.load_state_dict(attn.state_dict())
        inp = x.to(dtype).requires_grad_(True)
        if backends is None:  # the module's own path
            out = layer(inp)
        else:  # the plain SDPA call with the given backends (the module falls back to its plain path on CPU)
            with sdpa_kernel(backends):
                query = layer.split(layer.to_q(inp))
                key, value = layer.key_values(inp)
                out = torch.nn.functional.scaled_dot_product_attention(query, key, value)
                out = layer.to_out[0](out.transpose(1, 2).flatten(2))
        out.square().sum().backward()
        return out.double(), inp.grad.double(), layer.to_q.weight.grad.double()

    reference = run(torch.float64, [SDPBackend.MATH])
    ours = run(torch.bfloat16)
    picked = run(torch.bfloat16, [SDPBackend.CUDNN_ATTENTION, SDPBackend.FLASH_ATTENTION, SDPBackend.MATH])
    for mine, sdpa, ref in zip(ours, picked, reference):
        scale = ref.abs().max()
        error, baseline = (mine - ref).abs().max() / scale, (sdpa - ref).abs().max() / scale
        # bf16 rounding sets both errors (a few 2^-8); kernels differ only in summation order
        assert error <= 2 * baseline + 2**-10, (error, baseline)


@pytest.mark.parametrize("p", [0.2, 0.9])  # 0.9: a threshold above 2^31
def test_keep_masks_follow_the_seed_keep_one_minus_p_and_change_with_each_graph_replay(p: float) -> None:
    import math

    from gr00t_model._keep_mask import draw_keep_mask
    from gr00t_model._keep_mask_kernel import QUARTER

    size = (32, 999_999)  # not a multiple of a program's span
    with torch.random.fork_rng(devices=[torch.cuda.current_device()]):
        torch.manual_seed(5)
        a = draw_keep_mask(size, p, "cuda")
        torch.manual_seed(5)
        b = draw_keep_mask(size, p, "cuda")
        n = a.numel()
        sigma = math.sqrt(p * (1 - p) / n)
        assert torch.equal(a, b) and abs(a.float().mean().item() - (1 - p)) < 6 * sigma
        # The four numbers of one Philox call land a quarter span apart: they must be independent draws.
        flat = a.view(-1)[: n - n % (4 * QUARTER)].view(-1, 4, QUARTER).float()
        both = (flat[:, 0] * flat[:, 1]).mean().item()
        assert abs(both - (1 - p) ** 2) < 6 * math.sqrt(4 / n)
        graph, static = torch.cuda.CUDAGraph(), None
        draw_keep_mask(size, p, "cuda")  # warm up (Triton compiles) outside the capture
        with torch.cuda.graph(graph):
            static = draw_keep_mask(size, p, "cuda")
        graph.replay()
        first = static.clone()
        graph.replay()
        assert not torch.equal(first, static)  # each replay draws a new seed
        assert abs(static.float().mean().item() - (1 - p)) < 6 * sigma
