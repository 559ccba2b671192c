"""fp32 master weights stored as their bf16 parameter plus a 16-bit remainder (FlatAdamW(remainders=True)).

The bf16 parameter is the round-to-nearest-even of the master, as autocast would compute it; the remainder is the
master's low 16 bits. Together they hold the fp32 value, so the step reads and writes 2 + 2 bytes per
parameter instead of the master's 4 + 4 and the parameter's 2 (26 instead of 28 bytes per AdamW step).
Megatron's and Transformer Engine's optimizers do the same (`store_param_remainders`).

Decoding: a remainder above 0x8000 means the parameter was rounded up, so the master's high half is one below
it. An exact tie (low half 0x8000) would be ambiguous: round-to-nearest-even sends it up or down depending on
the high half. So the encoder first moves a tie one fp32 ulp away from the tie, toward the side that rounding
already chose (the bf16 parameter does not change). The master then differs from plain fp32 AdamW's by one ulp
in such elements, about one in 65536 per step.

These are the torch forms (the CPU path and the reference of the Triton kernel's).
"""

from __future__ import annotations

import torch

TIE = 0x8000


def _with_bits(values: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """Non-negative int64 values below 2^bits -> the signed `dtype` (int16, int32) with those bits."""
    bits = torch.iinfo(dtype).bits
    return (values - (values >= 2 ** (bits - 1)).long() * 2**bits).to(dtype)


def decode(param: torch.Tensor, remainder: torch.Tensor) -> torch.Tensor:
    """The fp32 masters of bf16 `param` and int16 `remainder` (flat tensors of equal length)."""
    high = param.view(torch.int16).long() & 0xFFFF
    low = remainder.long() & 0xFFFF
    bits = ((high - (low > TIE).long()) << 16) | low
    return _with_bits(bits, torch.int32).view(torch.float32)


def encode_(master: torch.Tensor, param: torch.Tensor, remainder: torch.Tensor) -> None:
    """Write fp32 `master` as bf16 `param` and int16 `remainder` (ties moved one ulp first; `master` gets the
    moved value too, so that it equals decode(param, remainder))."""
    bits = master.view(torch.int32).long() & 0xFFFFFFFF
    tie = (bits & 0xFFFF) == TIE
    rounds_up = ((bits >> 16) & 1) == 1  # round-to-nearest-even sends a tie up from an odd high half
    bits = torch.where(tie, bits + torch.where(rounds_up, 1, -1), bits)
    param.view(torch.int16).copy_(_with_bits(((bits + TIE) >> 16) & 0xFFFF, torch.int16))
    remainder.copy_(_with_bits(bits & 0xFFFF, torch.int16))
    master.copy_(_with_bits(bits, torch.int32).view(torch.float32))
