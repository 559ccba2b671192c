"""The DiT's VL context cast once for all cross blocks (`_context_cast`) against autocast casting it in each
block: the same forward and parameter gradients bit for bit, the context's gradient the same fp32 sum in
another association."""

from __future__ import annotations

import pytest
import torch
from gr00t_model import _context_cast
from gr00t_model._dit import AlternateVLDiT


def _run(dit, cast_once: bool, monkeypatch, grad_sum=None, device="cpu"):
    monkeypatch.setattr(_context_cast, "CAST_ONCE", cast_once)
    dit.grad_sum = grad_sum
    dit.zero_grad(set_to_none=True)
    gen = torch.Generator().manual_seed(3)
    tokens = torch.randn(2, 5, 64, generator=gen).to(device)
    context = torch.randn(2, 7, 64, generator=gen).to(device).requires_grad_()
    text = torch.tensor([[1, 1, 1, 0, 0, 0, 0], [1, 1, 0, 0, 0, 0, 0]], dtype=torch.bool, device=device)
    buckets = torch.tensor([3, 998], device=device)
    with torch.random.fork_rng(), torch.autocast(device, dtype=torch.bfloat16, cache_enabled=False):
        torch.manual_seed(5)  # the same dropout masks in both runs
        out = dit(tokens, context, buckets, text, ~text)
    out.float().square().sum().backward()
    grads = {name: p.grad.clone() for name, p in dit.named_parameters()}
    return out.detach(), context.grad.clone(), grads


def test_one_cast_gives_the_per_block_casts_results(fp32_tiny, monkeypatch) -> None:
    dit = AlternateVLDiT(fp32_tiny(dit_num_layers=6, dit_dropout=0.2)).train()
    out, context_grad, grads = _run(dit, False, monkeypatch)
    seen = []

    def recording_sum(*parts):
        seen.append(parts)
        return _context_cast.sum_grads(*parts)

    out2, context_grad2, grads2 = _run(dit, True, monkeypatch, recording_sum)
    assert len(seen) == 1 and len(seen[0]) == 6 and all(g.dtype == torch.bfloat16 for g in seen[0])
    assert torch.equal(out, out2)  # the projections read the same bf16 values
    assert all(torch.equal(grads[name], grads2[name]) for name in grads)
    # Both sum the same six fp32 terms (widening bf16 is exact), in different associations: each fp32 add
    # rounds by at most 2^-24 of the partial sum, so the two sums differ by at most 2 * 5 * 2^-24 * sum |terms|.
    magnitude = sum(g.float().abs() for g in seen[0])
    assert torch.all((context_grad - context_grad2).abs() <= 10 * 2**-24 * magnitude)
    assert not torch.equal(context_grad2, torch.zeros_like(context_grad2))


def test_the_gradient_sum_pairs_each_blocks_k_and_v_then_runs_from_the_last_block() -> None:
    gen = torch.Generator().manual_seed(0)
    parts = [torch.randn(4, 3, generator=gen).bfloat16() * 10 ** (i % 3) for i in range(6)]
    k0, v0, k1, v1, k2, v2 = (p.float() for p in parts)
    assert torch.equal(_context_cast.sum_grads(*parts), ((k2 + v2) + (k1 + v1)) + (k0 + v0))


def test_applies_only_where_autocast_narrows_an_fp32_context(monkeypatch) -> None:
    context = torch.randn(2, 3)
    monkeypatch.setattr(_context_cast, "CAST_ONCE", True)
    assert not _context_cast.applies(context)  # no autocast
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert _context_cast.applies(context)
        assert not _context_cast.applies(context.bfloat16())
    monkeypatch.setattr(_context_cast, "CAST_ONCE", False)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert not _context_cast.applies(context)


def test_compiled_blocks_compile_the_sum_and_uncompiling_drops_it(monkeypatch) -> None:
    pytest.importorskip("torch._inductor")
    from gr00t_model import GR00TN16, GR00TConfig

    model = GR00TN16(GR00TConfig.preset("tiny"))
    model.compile_blocks(backend="eager")  # no code generation: only the wiring is under test
    assert model.action_head.model.grad_sum is not None
    model.uncompile_blocks()
    assert model.action_head.model.grad_sum is None


def test_compiled_blocks_give_the_same_context_gradient_bit_for_bit(fp32_tiny, monkeypatch) -> None:
    """As compile_blocks runs them (Inductor, here on the CPU): the blocks' compiled backward sums each block's
    k and v gradients in fp32 and autograd adds the blocks from the last back; the compiled sum does the same
    additions in the same order, so even the context's gradient is equal."""
    dit = AlternateVLDiT(fp32_tiny(dit_num_layers=6, dit_dropout=0.2)).train()
    for block in dit.transformer_blocks:
        block.forward = torch.compile(type(block).forward.__get__(block), dynamic=False)
    compiled_sum = torch.compile(_context_cast.sum_grads, dynamic=False)
    out, context_grad, grads = _run(dit, False, monkeypatch)
    out2, context_grad2, grads2 = _run(dit, True, monkeypatch, compiled_sum)
    assert torch.equal(out, out2) and torch.equal(context_grad, context_grad2)
    assert all(torch.equal(grads[name], grads2[name]) for name in grads)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_compiled_blocks_on_the_gpu_give_the_per_block_casts_results(fp32_tiny, monkeypatch) -> None:
    """As compile_blocks runs them: Inductor-compiled blocks and the compiled gradient sum (one kernel)."""
    dit = AlternateVLDiT(fp32_tiny(dit_num_layers=6, dit_dropout=0.2)).cuda().train()
    for block in dit.transformer_blocks:
        block.forward = torch.compile(type(block).forward.__get__(block), dynamic=False)
    compiled_sum = torch.compile(_context_cast.sum_grads, dynamic=False)
    out, context_grad, grads = _run(dit, False, monkeypatch, device="cuda")
    out2, context_grad2, grads2 = _run(dit, True, monkeypatch, compiled_sum, device="cuda")
    assert torch.equal(out, out2)
    assert all(torch.equal(grads[name], grads2[name]) for name in grads)
    torch.testing.assert_close(context_grad2, context_grad, rtol=1e-6, atol=1e-7)  # fp32 sums, reassociated
