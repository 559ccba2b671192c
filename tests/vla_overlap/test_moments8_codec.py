"""The 8-bit moment codec of DistributedAdamW(moments="int8") (_moments8): round-trip error bounds derived from
each block's largest magnitude, idempotence (what makes a resume from decoded fp32 moments exact), the floors,
and the decoding tables.

Bound: a code is q = floor(L * t + 1/2) with t = sqrt(|y| / a), so |t - q / L| <= 1 / (2L), and the decoded
value a (q / L)^2 differs from y = a t^2 by a |t - q/L| (t + q/L) <= (2 sqrt(a |y|) + a / (2L)) / (2L). fp32
rounding adds a few ulps of a (the ratio, its square root, the table entry and the product: 2^-21 a covers them).
For w = sqrt(v), a value below the first level a / 255^2 is raised to it instead of becoming zero."""

from __future__ import annotations

import torch
from vla_overlap._moments8 import (
    M_FLOOR,
    QBLOCK,
    W_FLOOR,
    decode_m,
    decode_moment,
    decode_w,
    encode_m_,
    encode_moment_,
    encode_w_,
    levels,
)

SLACK = 2.0**-21


def _blocks(seed: int, count: int = 4000, top: float = 30) -> torch.Tensor:
    """`count` blocks of 64 values, block scales from 1e-30 to 1e`top`, magnitudes within a block spread over
    six decades (what Adam's moments look like: a few large entries, many small), some exact zeros."""
    gen = torch.Generator().manual_seed(seed)
    scale = torch.logspace(-30, top, count).repeat_interleave(QBLOCK)
    spread = 10 ** (-6 * torch.rand(count * QBLOCK, generator=gen))
    y = torch.randn(count * QBLOCK, generator=gen).sign() * spread * scale
    y[::97] = 0
    return y


def _encode_m(y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    codes, scales = torch.empty(len(y), dtype=torch.int8), torch.empty(len(y) // QBLOCK)
    encode_m_(y, codes, scales)
    return codes, scales


def _encode_w(y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    codes, scales = torch.empty(len(y), dtype=torch.uint8), torch.empty(len(y) // QBLOCK)
    encode_w_(y, codes, scales)
    return codes, scales


def test_the_first_moment_round_trips_within_its_bound_from_the_block_max() -> None:
    y = _blocks(0)
    codes, scales = _encode_m(y)
    assert torch.equal(scales, y.abs().view(-1, QBLOCK).amax(dim=1))  # the scale is the block's largest |m|
    a, y = scales.repeat_interleave(QBLOCK).double(), y.double()  # the bound in float64 (no under/overflow)
    error = (decode_m(codes, scales).double() - y).abs()
    bound = (2 * (a * y.abs()).sqrt() + a / 254) / 254 + SLACK * a
    assert bool((error <= bound).all())
    assert float((error / bound).max()) > 0.9  # the bound is what the codec reaches, not a loose one
    assert bool((decode_m(codes, scales)[y == 0] == 0).all()) and codes.abs().max() == 127
    # the square-root map: values at 1.1 % to 2 % of their block max within 8 % of themselves (a linear map:
    # 36 %), and values at 0.2 % to 0.39 % of it nonzero (a linear map rounds everything below a / 254 to zero)
    small = (y.abs() > 1.1e-2 * a) & (y.abs() < 2e-2 * a)
    assert int(small.sum()) > 1000 and bool((error[small] <= 0.08 * y.abs()[small]).all())
    tiny = (y.abs() > 2e-3 * a) & (y.abs() < a / 254)
    assert int(tiny.sum()) > 1000 and bool(codes[tiny].ne(0).all())


def test_the_second_moment_round_trips_as_its_square_root_and_never_becomes_zero() -> None:
    w = _blocks(1).abs()
    codes, scales = _encode_w(w)
    a, w = scales.repeat_interleave(QBLOCK).double(), w.double()
    flushed = (
        w.view(-1, QBLOCK).amax(dim=1).repeat_interleave(QBLOCK) < W_FLOOR
    )  # the floor: zero, tested below
    assert 0 < int(flushed.sum()) < len(w) // 2 and bool((a[flushed] == 0).all())
    error = (decode_w(codes, scales).double() - w).abs()[~flushed]
    a, w = a[~flushed], w[~flushed]
    first_level = a / 255**2
    bound = (2 * (a * w).sqrt() + a / 510) / 510 + SLACK * a + first_level * (w < first_level)
    assert bool((error <= bound).all())
    assert float((error / bound).max()) > 0.9
    codes = codes[~flushed]
    nonzero = w > 0
    assert bool((codes[nonzero] >= 1).all()) and bool((codes[~nonzero] == 0).all()) and codes.max() == 255


def test_encoding_decoded_moments_gives_the_same_codes_and_scales_back() -> None:
    """What makes a resume from a state dict (decoded fp32 moments, v = w^2) continue bit for bit: a block's
    largest element decodes to its scale exactly, every other within 1e-4 of its level, and sqrt(w^2) = w."""
    flat = {"master": torch.zeros(4000 * QBLOCK)}
    from vla_overlap._moments8 import allocate

    allocate(flat)
    whole = slice(0, len(flat["master"]))
    encode_moment_(flat, "exp_avg", whole, _blocks(2))
    encode_moment_(flat, "exp_avg_sq", whole, _blocks(3, top=19).square())  # v from 0 (underflow) to 1e38
    first = {k: flat[k].clone() for k in ("exp_avg", "exp_avg_sq", "exp_avg_scale", "exp_avg_sq_scale")}
    for _ in range(2):
        m, v = decode_moment(flat, "exp_avg", whole), decode_moment(flat, "exp_avg_sq", whole)
        encode_moment_(flat, "exp_avg", whole, m)
        encode_moment_(flat, "exp_avg_sq", whole, v)
        for key, value in first.items():
            assert torch.equal(flat[key], value), key
    assert bool(flat["exp_avg_sq_scale"].gt(0).any()) and bool(flat["exp_avg_sq_scale"].eq(0).any())


def test_blocks_below_the_floors_are_stored_as_zero() -> None:
    """exp_avg blocks whose largest magnitude is subnormal, sqrt(exp_avg_sq) blocks below 2^-50 (v < 8e-31):
    zero codes and scale, so that decoded values never underflow on the way back (idempotence above)."""
    y = torch.tensor([M_FLOOR * 0.5] * QBLOCK + [M_FLOOR] * QBLOCK)
    codes, scales = _encode_m(y)
    assert scales.tolist() == [0.0, M_FLOOR] and not codes[:QBLOCK].any() and codes[QBLOCK:].eq(127).all()
    w = torch.tensor([W_FLOOR * 0.99] * QBLOCK + [W_FLOOR] * QBLOCK)
    codes, scales = _encode_w(w)
    assert scales.tolist() == [0.0, W_FLOOR] and not codes[:QBLOCK].any() and codes[QBLOCK:].eq(255).all()


def test_the_decoding_tables_are_the_correctly_rounded_squares_ending_at_one() -> None:
    for count in (127, 255):
        table = levels(count)
        assert table.dtype == torch.float32 and len(table) == count + 1
        assert table[0] == 0 and table[-1] == 1  # a block's largest element decodes to its scale exactly
        exact = (torch.arange(count + 1, dtype=torch.float64) / count) ** 2
        assert bool(((table.double() - exact).abs() <= exact * 2.0**-24).all())
