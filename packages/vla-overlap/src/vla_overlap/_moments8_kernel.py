"""The Triton kernel of the flat step with 8-bit moments (imported only on CUDA with Triton, or under Triton's
interpreter; the arithmetic and the codec are _moments8.torch_step8's, operation for operation).

One program steps one block of the flat step's plan (at most BLOCK elements of one run, starting and ending at
multiples of QBLOCK) as a [BLOCK / QBLOCK, QBLOCK] tile: each row of the tile is one quantization block, decoded
with its scales, stepped, and encoded again with the new largest magnitude of the row. The kernel is compiled
without fused multiply-adds (enable_fp_fusion=False), so every operation rounds as the torch form's does and the
two give the same bits; the codec's square roots and divisions are the IEEE ones (sqrt_rn, div_rn).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ._flat_adamw import BLOCK
from ._flat_adamw_kernel import _decay_block, _load_master, _store_master
from ._moments8 import M_FLOOR, M_LEVELS, QBLOCK, W_FLOOR, W_LEVELS, levels


@triton.jit
def _encode(mag, live, floor, count: tl.constexpr):
    """Per row of the tile: the scale (the row's largest magnitude; 0 below `floor`) and the codes as floats
    (_moments8._codes)."""
    scale = tl.max(tl.where(live, mag, 0.0), axis=1)
    scale = tl.where(scale >= floor, scale, 0.0)
    inverse = tl.div_rn(tl.full(scale.shape, 1.0, tl.float32), tl.where(scale > 0, scale, 1.0))
    inverse = tl.where(scale > 0, inverse, 0.0)
    return scale, tl.floor(tl.sqrt_rn(mag * inverse[:, None]) * count + 0.5)


@triton.jit
def _adamw8_block(p_ptr, g_ptr, qm_ptr, qw_ptr, am_ptr, aw_ptr, fm_ptr, fw_ptr, out_ptr, rem_ptr, blocks_ptr,
                  table_ptr, coef_ptr, HAS_OUT: tl.constexpr, REM: tl.constexpr, HAS_COEF: tl.constexpr,
                  BLOCK: tl.constexpr, QBLOCK: tl.constexpr, M_FLOOR: tl.constexpr, W_FLOOR: tl.constexpr,
                  M_LEVELS: tl.constexpr, W_LEVELS: tl.constexpr):  # fmt: skip
    block = blocks_ptr + tl.program_id(0).to(tl.int64) * 3  # (start, length, row)
    start = tl.multiple_of(tl.load(block), QBLOCK)
    length = tl.multiple_of(tl.load(block + 1), QBLOCK)
    row = table_ptr + tl.load(block + 2) * 8
    decay = tl.load(row + 0)
    beta1 = tl.load(row + 1)
    beta2 = tl.load(row + 2)
    eps = tl.load(row + 3)
    step_size = tl.load(row + 4)
    bc2 = tl.load(row + 5)
    rows = tl.arange(0, BLOCK // QBLOCK)
    lanes = rows[:, None] * QBLOCK + tl.arange(0, QBLOCK)[None, :]
    live = lanes < length
    offsets = start + lanes
    qblocks = start // QBLOCK + rows
    live_rows = rows * QBLOCK < length
    p = _load_master(p_ptr, out_ptr, rem_ptr, offsets, live, REM)
    g = tl.load(g_ptr + offsets, mask=live, other=0.0).to(tl.float32)  # bf16 gradients widen exactly
    if HAS_COEF:
        g = g * tl.load(coef_ptr)
    # decode: scale * (q / L)^2 from the tables of levels (_moments8.levels)
    qm = tl.load(qm_ptr + offsets, mask=live, other=0).to(tl.int32)
    qw = tl.load(qw_ptr + offsets, mask=live, other=0).to(tl.int32)
    am = tl.load(am_ptr + qblocks, mask=live_rows, other=0.0)
    aw = tl.load(aw_ptr + qblocks, mask=live_rows, other=0.0)
    mag = am[:, None] * tl.load(fm_ptr + tl.abs(qm))
    m = tl.where(qm < 0, -mag, mag)
    w = aw[:, None] * tl.load(fw_ptr + qw)
    v = w * w
    # AdamW (as _flat_adamw_kernel._adamw_block)
    p = p * decay
    m = m + (1.0 - beta1) * (g - m)
    v = v * beta2 + (1.0 - beta2) * g * g
    w = tl.sqrt_rn(v)
    p = p - tl.div_rn(step_size * m, tl.div_rn(w, bc2) + eps)
    _store_master(p, p_ptr, out_ptr, rem_ptr, offsets, live, HAS_OUT, REM)
    # encode with each row's new largest magnitude
    am, cm = _encode(tl.abs(m), live, M_FLOOR, M_LEVELS)
    cm = tl.where(m < 0, -cm, cm)
    aw, cw = _encode(w, live, W_FLOOR, W_LEVELS)
    cw = tl.where((w > 0) & (aw[:, None] > 0), tl.maximum(cw, 1.0), cw)  # never lose a nonzero v
    tl.store(qm_ptr + offsets, cm.to(tl.int8), mask=live)
    tl.store(qw_ptr + offsets, cw.to(tl.uint8), mask=live)
    tl.store(am_ptr + qblocks, am, mask=live_rows)
    tl.store(aw_ptr + qblocks, aw, mask=live_rows)


@triton.jit
def _adamw8_blocks_kernel(p_ptr, g_ptr, qm_ptr, qw_ptr, am_ptr, aw_ptr, fm_ptr, fw_ptr, out_ptr, rem_ptr,
                          blocks_ptr, table_ptr, coef_ptr, idle_ptr, HAS_OUT: tl.constexpr, REM: tl.constexpr,
                          HAS_COEF: tl.constexpr, HAS_IDLE: tl.constexpr, BLOCK: tl.constexpr,
                          QBLOCK: tl.constexpr, M_FLOOR: tl.constexpr, W_FLOOR: tl.constexpr,
                          M_LEVELS: tl.constexpr, W_LEVELS: tl.constexpr):  # fmt: skip
    if HAS_IDLE:
        if tl.load(idle_ptr + tl.program_id(0)) != 0:  # zero gradient and moments: decay only
            _decay_block(p_ptr, out_ptr, rem_ptr, blocks_ptr, table_ptr, HAS_OUT, REM, QBLOCK, BLOCK)
        else:
            _adamw8_block(p_ptr, g_ptr, qm_ptr, qw_ptr, am_ptr, aw_ptr, fm_ptr, fw_ptr, out_ptr, rem_ptr,
                          blocks_ptr, table_ptr, coef_ptr, HAS_OUT, REM, HAS_COEF, BLOCK, QBLOCK, M_FLOOR,
                          W_FLOOR, M_LEVELS, W_LEVELS)  # fmt: skip
    else:
        _adamw8_block(p_ptr, g_ptr, qm_ptr, qw_ptr, am_ptr, aw_ptr, fm_ptr, fw_ptr, out_ptr, rem_ptr, blocks_ptr,
                      table_ptr, coef_ptr, HAS_OUT, REM, HAS_COEF, BLOCK, QBLOCK, M_FLOOR, W_FLOOR, M_LEVELS,
                      W_LEVELS)  # fmt: skip


_TABLES: dict[torch.device, tuple[torch.Tensor, torch.Tensor]] = {}


def level_tables(device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """The decoding tables on `device`, made once (a kernel captured in a CUDA graph keeps reading them)."""
    if device not in _TABLES:
        _TABLES[device] = (levels(M_LEVELS, device), levels(W_LEVELS, device))
    return _TABLES[device]


def adamw8_flat(master, grad, codes_m, codes_w, scales_m, scales_w, out, blocks, table, coef, idle=None,
                remainder=None, block=BLOCK, num_warps=4) -> None:  # fmt: skip
    """One AdamW step with 8-bit moments over `blocks` ([K, 3] int64: start, length <= block, table row; starts
    and lengths multiples of QBLOCK) of flat tensors: fp32 `master`, `grad`, int8 `codes_m` (exp_avg) and uint8
    `codes_w` (sqrt(exp_avg_sq)), with one fp32 scale per QBLOCK elements in `scales_m`, `scales_w`. `idle`,
    `remainder`, `out`, `table` and `coef` as in _flat_adamw_kernel.adamw_flat. No host synchronization and no
    allocation: capturable in a CUDA graph (the level tables are made at the first call on a device)."""
    if len(blocks) == 0:
        return
    fm, fw = level_tables(master.device)
    _adamw8_blocks_kernel[(len(blocks),)](
        master, grad, codes_m, codes_w, scales_m, scales_w, fm, fw, master if out is None else out,
        master if remainder is None else remainder, blocks, table, master if coef is None else coef,
        blocks if idle is None else idle, HAS_OUT=out is not None, REM=remainder is not None,
        HAS_COEF=coef is not None, HAS_IDLE=idle is not None, BLOCK=block, QBLOCK=QBLOCK, M_FLOOR=M_FLOOR,
        W_FLOOR=W_FLOOR, M_LEVELS=M_LEVELS, W_LEVELS=W_LEVELS, num_warps=num_warps, enable_fp_fusion=False,
    )  # fmt: skip
