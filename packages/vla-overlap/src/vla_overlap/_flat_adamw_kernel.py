"""The Triton kernel of FlatAdamW (imported only on CUDA with Triton; the arithmetic is _flat_adamw_steps.torch_step's)."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ._flat_adamw import BLOCK


@triton.jit
def _adamw_blocks_kernel(p_ptr, g_ptr, m_ptr, v_ptr, out_ptr, rem_ptr, blocks_ptr, table_ptr, coef_ptr, idle_ptr,
                         HAS_OUT: tl.constexpr, REM: tl.constexpr, HAS_COEF: tl.constexpr,
                         HAS_IDLE: tl.constexpr, ALIGN: tl.constexpr, BLOCK: tl.constexpr):  # fmt: skip
    if HAS_IDLE:
        if tl.load(idle_ptr + tl.program_id(0)) != 0:  # a row with zero gradient and moments: decay only
            _decay_block(p_ptr, out_ptr, rem_ptr, blocks_ptr, table_ptr, HAS_OUT, REM, ALIGN, BLOCK)
        else:
            _adamw_block(p_ptr, g_ptr, m_ptr, v_ptr, out_ptr, rem_ptr, blocks_ptr, table_ptr, coef_ptr, HAS_OUT,
                         REM, HAS_COEF, ALIGN, BLOCK)  # fmt: skip
    else:
        _adamw_block(p_ptr, g_ptr, m_ptr, v_ptr, out_ptr, rem_ptr, blocks_ptr, table_ptr, coef_ptr, HAS_OUT, REM,
                     HAS_COEF, ALIGN, BLOCK)  # fmt: skip


@triton.jit
def _load_master(p_ptr, out_ptr, rem_ptr, at, live, REM: tl.constexpr):
    """The fp32 master: stored, or decoded from the bf16 parameter and its remainder (_remainders.decode)."""
    if REM:
        high = tl.load(out_ptr + at, mask=live).to(tl.uint16, bitcast=True).to(tl.uint32)
        low = tl.load(rem_ptr + at, mask=live).to(tl.uint16, bitcast=True).to(tl.uint32)
        high = tl.where(low > 0x8000, high - 1, high)
        return ((high << 16) | low).to(tl.float32, bitcast=True)
    else:
        return tl.load(p_ptr + at, mask=live)


@triton.jit
def _store_master(p, p_ptr, out_ptr, rem_ptr, at, live, HAS_OUT: tl.constexpr, REM: tl.constexpr):
    """Store the master and its bf16 copy, or the copy and the remainder (_remainders.encode_)."""
    if REM:
        bits = p.to(tl.uint32, bitcast=True)
        odd = (bits >> 16) & 1
        bits = tl.where((bits & 0xFFFF) == 0x8000, tl.where(odd == 1, bits + 1, bits - 1), bits)
        high = ((bits + 0x8000) >> 16).to(tl.uint16)
        tl.store(out_ptr + at, high.to(tl.bfloat16, bitcast=True), mask=live)
        tl.store(rem_ptr + at, (bits & 0xFFFF).to(tl.uint16).to(tl.int16, bitcast=True), mask=live)
    else:
        tl.store(p_ptr + at, p, mask=live)
        if HAS_OUT:
            tl.store(out_ptr + at, p.to(out_ptr.dtype.element_ty), mask=live)


@triton.jit
def _decay_block(p_ptr, out_ptr, rem_ptr, blocks_ptr, table_ptr, HAS_OUT: tl.constexpr, REM: tl.constexpr,
                 ALIGN: tl.constexpr, BLOCK: tl.constexpr):  # fmt: skip
    block = blocks_ptr + tl.program_id(0).to(tl.int64) * 3
    decay = tl.load(table_ptr + tl.load(block + 2) * 8)
    if decay != 1.0:  # 1 - lr * wd often rounds to 1 in fp32 (1e-4 * 1e-5): then nothing changes
        start = tl.multiple_of(tl.load(block), ALIGN)
        at = start + tl.arange(0, BLOCK)
        live = tl.arange(0, BLOCK) < tl.multiple_of(tl.load(block + 1), ALIGN)
        p = _load_master(p_ptr, out_ptr, rem_ptr, at, live, REM) * decay
        _store_master(p, p_ptr, out_ptr, rem_ptr, at, live, HAS_OUT, REM)


@triton.jit
def _adamw_block(p_ptr, g_ptr, m_ptr, v_ptr, out_ptr, rem_ptr, blocks_ptr, table_ptr, coef_ptr,
                 HAS_OUT: tl.constexpr, REM: tl.constexpr, HAS_COEF: tl.constexpr, ALIGN: tl.constexpr,
                 BLOCK: tl.constexpr):  # fmt: skip
    block = blocks_ptr + tl.program_id(0).to(tl.int64) * 3  # (start, length, row): one run's piece
    # Starts and lengths are multiples of ALIGN (1 when they are not): saying so lets Triton use 16-byte
    # loads and stores; without it every access is 4 bytes wide (0.5 ms of n1.6-3b's step on an H200).
    start = tl.multiple_of(tl.load(block), ALIGN)
    length = tl.multiple_of(tl.load(block + 1), ALIGN)
    row = table_ptr + tl.load(block + 2) * 8
    decay = tl.load(row + 0)
    beta1 = tl.load(row + 1)
    beta2 = tl.load(row + 2)
    eps = tl.load(row + 3)
    step_size = tl.load(row + 4)
    bc2 = tl.load(row + 5)
    lanes = tl.arange(0, BLOCK)
    live = lanes < length
    offsets = start + lanes
    p = _load_master(p_ptr, out_ptr, rem_ptr, offsets, live, REM)
    g = tl.load(g_ptr + offsets, mask=live).to(tl.float32)  # bf16 gradients widen exactly
    if HAS_COEF:
        g = g * tl.load(coef_ptr)
    m = tl.load(m_ptr + offsets, mask=live)
    v = tl.load(v_ptr + offsets, mask=live)
    p = p * decay
    m = m + (1.0 - beta1) * (g - m)
    v = v * beta2 + (1.0 - beta2) * g * g
    # IEEE sqrt and division (Triton's defaults are approximate), as torch's kernels compute them
    p = p - tl.div_rn(step_size * m, tl.div_rn(tl.sqrt_rn(v), bc2) + eps)
    _store_master(p, p_ptr, out_ptr, rem_ptr, offsets, live, HAS_OUT, REM)
    tl.store(m_ptr + offsets, m, mask=live)
    tl.store(v_ptr + offsets, v, mask=live)


def adamw_flat(master, grad, exp_avg, exp_avg_sq, out, blocks, table, coef, block=BLOCK, num_warps=4,
               align=1, idle=None, remainder=None) -> None:  # fmt: skip
    """One AdamW step over the `blocks` ([K, 3] int64: start, length <= block, table row) of flat fp32
    tensors of equal length (see FlatAdamW); every start and length a multiple of `align`. `idle` ([K] bool):
    blocks whose gradient and moments are zero, which only decay. With `remainder` (int16) the master is read
    from and written as the bf16 `out` and the remainder (_remainders), and `master` is not touched."""
    if len(blocks) == 0:
        return
    _adamw_blocks_kernel[(len(blocks),)](
        master, grad, exp_avg, exp_avg_sq, master if out is None else out,
        master if remainder is None else remainder, blocks, table, master if coef is None else coef,
        blocks if idle is None else idle, HAS_OUT=out is not None, REM=remainder is not None,
        HAS_COEF=coef is not None, HAS_IDLE=idle is not None, ALIGN=align, BLOCK=block, num_warps=num_warps,
    )  # fmt: skip


@triton.jit
def _sum_of_squares_kernel(x_ptr, partial_ptr, n, BLOCK: tl.constexpr, LOOPS: tl.constexpr):
    start = tl.program_id(0).to(tl.int64) * (BLOCK * LOOPS)
    acc = tl.zeros([BLOCK], tl.float32)
    for i in tl.static_range(LOOPS):
        offsets = start + i * BLOCK + tl.arange(0, BLOCK)
        x = tl.load(x_ptr + offsets, mask=offsets < n, other=0.0).to(tl.float32)
        acc += x * x
    tl.store(partial_ptr + tl.program_id(0), tl.sum(acc))


def sum_of_squares(flat: torch.Tensor, block: int = 4096, loops: int = 8) -> torch.Tensor:
    """The sum of squares of a contiguous flat tensor, in fp32: one partial per program, summed in a fixed
    order (deterministic, unlike atomics); bf16 input widens as it loads. Each program sums `loops` blocks
    element-wise before its one tree reduction: with one 4096-element block per program, the reductions and
    launches set the pace (0.79 TB/s over n1.6-3b's bf16 gradients beside the frozen prefix on an H200,
    against the update kernel's 1.6)."""
    n = flat.numel()
    partials = flat.new_empty(triton.cdiv(n, block * loops), dtype=torch.float32)
    if n:
        _sum_of_squares_kernel[(len(partials),)](flat, partials, n, BLOCK=block, LOOPS=loops, num_warps=8)
    return partials.sum()
