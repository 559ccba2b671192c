"""Per-embodiment projections as grouped GEMMs (GR00TConfig.grouped_embodiment_gemms) against the release's
per-sample gather and bmm."""

from __future__ import annotations

import torch
from gr00t_model import GR00TN16, GR00TConfig, make_dummy_batch
from gr00t_model._action_head import CategorySpecificLinear
from gr00t_model._grouped_matmul import slot_matmul

SLOTS = torch.tensor([3, 0, 3, 1, 3])  # unsorted; slots 2 and 4 unused


def _layer_pair(dtype=torch.float32) -> tuple[CategorySpecificLinear, CategorySpecificLinear]:
    torch.manual_seed(0)
    plain = CategorySpecificLinear(5, 16, 24)
    torch.nn.init.normal_(plain.b)
    grouped = CategorySpecificLinear(5, 16, 24, grouped=True)
    grouped.load_state_dict(plain.state_dict())
    grouped.to(dtype)
    return plain, grouped


def _run(layer, x, slots, autocast: bool = False):
    x = x.clone().requires_grad_(True)
    layer.zero_grad(set_to_none=True)
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
        out = layer(x, slots)
    out.float().pow(2).sum().backward()
    return out, x.grad, layer.W.grad, layer.b.grad


def test_grouped_gemms_compute_the_per_sample_products_and_gradients() -> None:
    plain, grouped = _layer_pair()
    x = torch.randn(5, 7, 16)
    want, got = _run(plain, x, SLOTS), _run(grouped, x, SLOTS)
    # fp32 either way; a slot's weight gradient sums its samples in one GEMM instead of one per sample,
    # so the sums are reassociated: equal to fp32 rounding, not bitwise
    for a, b in zip(want, got):
        torch.testing.assert_close(b, a)
    unused = [2, 4]
    assert torch.equal(got[2][unused], torch.zeros_like(got[2][unused]))  # empty groups: zero gradient
    assert got[2][[0, 1, 3]].abs().amin(dim=(1, 2)).gt(0).all()


def test_grouped_gemms_take_the_grouped_kernel(monkeypatch) -> None:
    calls = []
    real = torch._grouped_mm
    monkeypatch.setattr(torch, "_grouped_mm", lambda *a, **k: calls.append(1) or real(*a, **k))
    _, grouped = _layer_pair()
    _run(grouped, torch.randn(5, 2, 16), SLOTS)
    assert len(calls) == 3  # forward, input gradient, weight gradient


def test_bf16_tables_compute_what_autocast_computes_from_fp32_tables() -> None:
    _, fp32 = _layer_pair()
    _, bf16 = _layer_pair(torch.bfloat16)
    bf16.b.data = fp32.b.data.clone()  # biases stay fp32: autocast adds them in fp32
    x = torch.randn(5, 7, 16)
    a, b = _run(fp32, x, SLOTS, autocast=True), _run(bf16, x, SLOTS, autocast=True)
    # autocast rounds the fp32 table to bf16 before the GEMM and widens its bf16 gradient exactly: the
    # same kernels on the same values
    for u, v in zip(a, b):
        assert torch.equal(u.float(), v.float())


def test_grouped_gemms_under_autocast_match_the_gather_to_one_bf16_rounding() -> None:
    plain, grouped = _layer_pair()
    x = torch.randn(5, 7, 16)
    want = _run(plain, x, SLOTS, autocast=True)[0]
    got = _run(grouped, x, SLOTS, autocast=True)[0]
    # both accumulate each product in fp32 and round it to bf16 once; only the accumulation order may
    # differ, which moves a result by at most one bf16 ulp (2^-7 relative, bias added after in fp32)
    torch.testing.assert_close(got.float(), want.float(), rtol=2**-7, atol=1e-5)


def test_slot_matmul_keeps_batch_order_with_one_sample_per_slot_and_all_in_one() -> None:
    w = torch.randn(4, 8, 8)
    x = torch.randn(4, 3, 8)
    for slots in (torch.tensor([3, 2, 1, 0]), torch.tensor([2, 2, 2, 2])):
        want = torch.stack([x[i] @ w[s] for i, s in enumerate(slots.tolist())])
        torch.testing.assert_close(slot_matmul(x, w, slots), want)


def test_the_model_trains_the_same_with_grouped_gemms() -> None:
    config = GR00TConfig.preset("tiny")
    plain = GR00TN16(config).train()
    grouped = GR00TN16(GR00TConfig.preset("tiny", grouped_embodiment_gemms=True)).train()
    grouped.load_state_dict(plain.state_dict())
    batch = make_dummy_batch(config, 3, num_images=1)
    batch["embodiment_id"] = torch.tensor([5, 1, 5])
    noise = torch.randn(3, config.action_horizon, config.max_action_dim)
    t = torch.tensor([0.2, 0.5, 0.9])
    grads = []
    for model in (plain, grouped):
        with torch.random.fork_rng():  # the same dropout draws in both, the global stream untouched
            torch.manual_seed(5)
            model(batch, noise=noise, t=t)["loss"].backward()
        grads.append({n: p.grad for n, p in model.named_parameters() if p.grad is not None})
    assert grads[0].keys() == grads[1].keys()
    for name, g in grads[0].items():
        torch.testing.assert_close(grads[1][name], g, rtol=1e-4, atol=1e-6, msg=name)
    tables = {id(layer.W) for layer in grouped.action_head.embodiment_layers()}
    assert len(tables) == 7 and tables <= {id(p) for p in grouped.matmul_weights()}
    assert not tables & {id(p) for p in plain.matmul_weights()}


def test_one_sort_per_forward_gives_the_per_layer_sorts_result_bit_for_bit(monkeypatch) -> None:
    """SlotGroups: the action head sorts the batch by slot once per forward and every grouped layer reuses the
    order, its inverse and the group ends. The same gathers and grouped GEMMs run on the same values, so the
    loss and every gradient equal those of sorting in each layer bit for bit; and one forward sorts twice (the
    order and its inverse) instead of twice per layer."""
    from gr00t_model import _action_head

    config = GR00TConfig.preset("tiny", grouped_embodiment_gemms=True)
    model = GR00TN16(config).train()
    batch = make_dummy_batch(config, 3, num_images=1)
    batch["embodiment_id"] = torch.tensor([5, 1, 5])
    noise = torch.randn(3, config.action_horizon, config.max_action_dim)
    t = torch.tensor([0.2, 0.5, 0.9])
    sorts = []
    real_argsort = torch.argsort
    monkeypatch.setattr(torch, "argsort", lambda *a, **k: sorts.append(1) or real_argsort(*a, **k))
    runs = []
    for shared in (True, False):
        if not shared:  # the layers get the plain slot tensor: each sorts for itself, as before
            monkeypatch.setattr(_action_head.ActionHead, "slot_groups", lambda self, slot: slot)
        sorts.clear()
        model.zero_grad(set_to_none=True)
        with torch.random.fork_rng():
            torch.manual_seed(5)
            loss = model(batch, noise=noise, t=t)["loss"]
        loss.backward()
        runs.append(
            (loss, {n: p.grad for n, p in model.named_parameters() if p.grad is not None}, len(sorts))
        )
    (loss_a, grads_a, sorts_a), (loss_b, grads_b, sorts_b) = runs
    assert sorts_a == 2 and sorts_b == 2 * len(model.action_head.embodiment_layers())
    assert torch.equal(loss_a, loss_b)
    assert grads_a.keys() == grads_b.keys() and all(torch.equal(grads_a[n], grads_b[n]) for n in grads_a)
