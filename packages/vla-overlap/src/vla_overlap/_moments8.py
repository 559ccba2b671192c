"""8-bit AdamW moments for the flat step (DistributedAdamW(moments="int8")): the codec and the step of one bucket
in torch ops (the CPU path, and the reference the Triton kernel in _moments8_kernel is tested against).

Each bucket's shard is cut into blocks of QBLOCK = 64 elements at multiples of 64. Per block, each moment keeps
one fp32 scale, the largest magnitude in the block, and one byte per element:

- exp_avg `m` (signed): int8 code q = sign(m) * floor(127 * sqrt(|m| / a) + 1/2), a = max |m|.
- exp_avg_sq `v` is stored as its square root w = sqrt(v) >= 0: uint8 code q = floor(255 * sqrt(w / a) + 1/2),
  a = max w; a nonzero w never gets code 0 (it would leave that element's update divided by eps alone).

Decoding is y = a * F[|q|] with F[q] = (q / L)^2 rounded to fp32 (L = 127 or 255). The square-root map spends
the codes where Adam needs them: relative precision falls off slowly toward small values instead of every value
below a / 254 becoming zero, as with a linear map (bitsandbytes and torchao use a non-linear "dynamic" map for
the same reason). Round trip, per element, from the block max a (codec tests): |y - y'| <= (2 sqrt(a |y|) +
a / (2 L)) / (2 L), plus a few fp32 ulps of a; for w, a value below the first level a / 255^2 becomes that level.

Why 64 elements: it is the flat step's alignment (the layout starts every parameter at a multiple of 64, and the
kernel's blocks start and end at multiples of 64), so a quantization block never holds two parameters, two
parameter groups, a skipped parameter, a tracked row's edge or a shard boundary: each block is stepped whole by
one kernel program, or not at all. The scales cost 2 * 4 / 64 = 0.125 bytes per element (0.2 GB for n1.6-3b's
1.62 B trainable weights), 2.125 bytes in all instead of fp32's 8.

The codec is idempotent: encoding decoded moments gives the same codes and scales back, since a block's largest
element decodes to a exactly (F[L] = 1) and every other lands within 1e-4 of its level. So a state dict may hold
decoded fp32 moments (the format of fp32 runs) and a resume is bitwise the continued run. To keep that exact for
tiny values, a block whose largest |m| is subnormal (below 2^-126), or whose largest w is below 2^-50 (v below
8e-31, far under eps^2), is stored as zero: those moments change no update that fp32 arithmetic would resolve.

Every operation below rounds as IEEE fp32 does (square roots through float64, which rounds them correctly;
torch's CPU fp32 sqrt can be one ulp off), in the order of the kernel, which does not fuse multiply-adds: the
kernel and this code give the same bits.
"""

from __future__ import annotations

from typing import Any

import torch

from ._remainders import decode
from ._remainders import encode_ as encode_master_

QBLOCK = 64
"""Elements per quantization block (the flat step's ALIGN)."""
M_LEVELS = 127
"""exp_avg: int8 codes -127..127."""
W_LEVELS = 255
"""sqrt(exp_avg_sq): uint8 codes 0..255."""
M_FLOOR = 2.0**-126
"""A block of exp_avg whose largest magnitude is below this (subnormal) is stored as zero."""
W_FLOOR = 2.0**-50
"""A block of sqrt(exp_avg_sq) whose largest value is below this is stored as zero (so that v = w^2 stays normal,
and a state dict's v gives back w exactly)."""
BYTES_PER_ELEMENT = 2 + 2 * 4 / QBLOCK
"""Both moments, codes and scales, per trainable element (fp32 moments: 8)."""
MOMENT_BYTES = {"fp32": 8.0, "int8": BYTES_PER_ELEMENT}
"""Bytes of both AdamW moments per stepped element, by `DistributedAdamW(moments=...)`: for memory planners."""


def levels(count: int, device: torch.device | str = "cpu") -> torch.Tensor:
    """F[q] = (q / count)^2 rounded to fp32, q = 0..count: the decoding table (F[count] = 1 exactly)."""
    q = torch.arange(count + 1, dtype=torch.float64)
    return ((q / count) ** 2).float().to(device)


def sqrt_rn(x: torch.Tensor) -> torch.Tensor:
    """The correctly rounded fp32 square root (float64's sqrt is correctly rounded, and rounding it to fp32
    again is exact for square roots), as the kernel's sqrt_rn."""
    return x.double().sqrt().float()


def decode_m(codes: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
    """exp_avg from int8 `codes` (a multiple of QBLOCK elements) and one scale per block."""
    table = levels(M_LEVELS, codes.device)
    mag = scales.view(-1, 1) * table[codes.view(-1, QBLOCK).abs().long()]
    return torch.where(codes.view(-1, QBLOCK) < 0, -mag, mag).view(-1)


def decode_w(codes: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
    """sqrt(exp_avg_sq) from uint8 `codes` and one scale per block."""
    table = levels(W_LEVELS, codes.device)
    return (scales.view(-1, 1) * table[codes.view(-1, QBLOCK).long()]).view(-1)


def _codes(mag: torch.Tensor, scale: torch.Tensor, count: int) -> torch.Tensor:
    """floor(count * sqrt(mag / scale) + 1/2) per element of [blocks, QBLOCK] `mag`; 0 where the scale is."""
    # one division per block; mag * inverse is within an ulp of 1 at most
    safe = torch.where(scale > 0, scale, 1.0)
    inverse = torch.where(scale > 0, torch.ones_like(safe) / safe, 0.0)
    return torch.floor(sqrt_rn(mag * inverse) * count + 0.5)


def encode_m_(m: torch.Tensor, codes: torch.Tensor, scales: torch.Tensor) -> None:
    """Write fp32 exp_avg `m` (a multiple of QBLOCK elements) as int8 `codes` and per-block `scales`."""
    blocks = m.view(-1, QBLOCK)
    mag = blocks.abs()
    scale = mag.amax(dim=1, keepdim=True)
    scale = torch.where(scale >= M_FLOOR, scale, 0.0)
    q = _codes(mag, scale, M_LEVELS)
    codes.copy_(torch.where(blocks < 0, -q, q).view(-1).to(torch.int8))
    scales.copy_(scale.view(-1))


def encode_w_(w: torch.Tensor, codes: torch.Tensor, scales: torch.Tensor) -> None:
    """Write fp32 w = sqrt(exp_avg_sq) >= 0 as uint8 `codes` and per-block `scales`."""
    blocks = w.view(-1, QBLOCK)
    scale = blocks.amax(dim=1, keepdim=True)
    scale = torch.where(scale >= W_FLOOR, scale, 0.0)
    q = _codes(blocks, scale, W_LEVELS)
    q = torch.where((blocks > 0) & (scale > 0), q.clamp(min=1.0), q)  # never lose a nonzero v
    codes.copy_(q.view(-1).to(torch.uint8))
    scales.copy_(scale.view(-1))


def allocate(flat: dict[str, Any]) -> None:
    """The 8-bit moments of a bucket (`flat` of FlatAdamW), zero: codes and one fp32 scale per block each."""
    numel, device = flat["master"].numel(), flat["master"].device
    if numel % QBLOCK:
        raise ValueError(f"8-bit moments need shards of a multiple of {QBLOCK} elements, got {numel}")
    flat["exp_avg"] = torch.zeros(numel, dtype=torch.int8, device=device)
    flat["exp_avg_sq"] = torch.zeros(numel, dtype=torch.uint8, device=device)
    flat["exp_avg_scale"] = torch.zeros(numel // QBLOCK, dtype=torch.float32, device=device)
    flat["exp_avg_sq_scale"] = torch.zeros(numel // QBLOCK, dtype=torch.float32, device=device)


def decode_moment(flat: dict[str, Any], key: str, window: slice) -> torch.Tensor:
    """fp32 `key` ("exp_avg" or "exp_avg_sq") of a QBLOCK-aligned `window` of the bucket, as fp32 AdamW keeps it
    (exp_avg_sq is w squared)."""
    blocks = slice(window.start // QBLOCK, window.stop // QBLOCK)
    if key == "exp_avg":
        return decode_m(flat["exp_avg"][window], flat["exp_avg_scale"][blocks])
    w = decode_w(flat["exp_avg_sq"][window], flat["exp_avg_sq_scale"][blocks])
    return w * w


def encode_moment_(flat: dict[str, Any], key: str, window: slice, values: torch.Tensor) -> None:
    """Encode fp32 `values` of `key` (exp_avg_sq as fp32 AdamW keeps it: v) into a QBLOCK-aligned `window`."""
    blocks = slice(window.start // QBLOCK, window.stop // QBLOCK)
    if key == "exp_avg":
        encode_m_(values, flat["exp_avg"][window], flat["exp_avg_scale"][blocks])
    else:
        encode_w_(sqrt_rn(values), flat["exp_avg_sq"][window], flat["exp_avg_sq_scale"][blocks])


def torch_step8(flat: dict[str, Any], table: torch.Tensor, coef: torch.Tensor | None,
                idle: torch.Tensor | None) -> None:  # fmt: skip
    """One AdamW step of a bucket with 8-bit moments, run by run (runs widened to whole blocks: the layout's zero
    padding, which AdamW keeps at zero), block by block where rows are tracked (an idle block only decays)."""
    if idle is None:
        pieces = [(start, -(-end // QBLOCK) * QBLOCK, row, False) for start, end, row in flat["runs"]]
    else:
        blocks = zip(flat["blocks"].tolist(), idle.tolist())
        pieces = [(start, start + length, row, skip) for (start, length, row), skip in blocks]
    rem = flat.get("rem")
    for start, end, row, skip in pieces:
        decay, beta1, beta2, eps, step_size, bc2 = table[row, :6].unbind()
        window = slice(start, end)
        p = flat["master"][window] if rem is None else decode(flat["out"][window], rem[window])
        p = p * decay
        if not skip:
            m, v = decode_moment(flat, "exp_avg", window), decode_moment(flat, "exp_avg_sq", window)
            g = flat["grad"][window].float()  # bf16 gradients widen exactly
            g = g if coef is None else g * coef
            m = m + (1 - beta1) * (g - m)
            v = v * beta2 + (1 - beta2) * g * g
            w = sqrt_rn(v)
            p = p - step_size * m / (w / bc2 + eps)
            blocks = slice(start // QBLOCK, end // QBLOCK)
            encode_m_(m, flat["exp_avg"][window], flat["exp_avg_scale"][blocks])
            encode_w_(w, flat["exp_avg_sq"][window], flat["exp_avg_sq_scale"][blocks])
        if rem is not None:
            encode_master_(p, flat["out"][window], rem[window])
        else:
            flat["master"][window].copy_(p)
            if flat["out"] is not None:
                flat["out"][window].copy_(p)
