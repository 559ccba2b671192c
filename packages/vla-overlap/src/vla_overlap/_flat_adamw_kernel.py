"""The Triton kernel of FlatAdamW (imported only on CUDA with Triton; the arithmetic is _flat_adamw._torch_step's)."""

from __future__ import annotations

import triton
import triton.language as tl

BLOCK = 4096


@triton.jit
def _adamw_flat_kernel(p_ptr, g_ptr, m_ptr, v_ptr, out_ptr, gid_ptr, table_ptr, coef_ptr, n,
                       HAS_OUT: tl.constexpr, HAS_COEF: tl.constexpr, BLOCK: tl.constexpr):  # fmt: skip
    offsets = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    inside = offsets < n
    group = tl.load(gid_ptr + offsets, mask=inside, other=255).to(tl.int32)
    live = inside & (group != 255)
    row = table_ptr + tl.where(live, group, 0) * 8
    decay = tl.load(row + 0, mask=live, other=1.0)
    beta1 = tl.load(row + 1, mask=live, other=0.0)
    beta2 = tl.load(row + 2, mask=live, other=0.0)
    eps = tl.load(row + 3, mask=live, other=1.0)
    step_size = tl.load(row + 4, mask=live, other=0.0)
    bc2 = tl.load(row + 5, mask=live, other=1.0)
    p = tl.load(p_ptr + offsets, mask=live, other=0.0)
    g = tl.load(g_ptr + offsets, mask=live, other=0.0)
    if HAS_COEF:
        g = g * tl.load(coef_ptr)
    m = tl.load(m_ptr + offsets, mask=live, other=0.0)
    v = tl.load(v_ptr + offsets, mask=live, other=0.0)
    p = p * decay
    m = m + (1.0 - beta1) * (g - m)
    v = v * beta2 + (1.0 - beta2) * g * g
    # IEEE sqrt and division (Triton's defaults are approximate), as torch's kernels compute them
    p = p - tl.div_rn(step_size * m, tl.div_rn(tl.sqrt_rn(v), bc2) + eps)
    tl.store(p_ptr + offsets, p, mask=live)
    tl.store(m_ptr + offsets, m, mask=live)
    tl.store(v_ptr + offsets, v, mask=live)
    if HAS_OUT:
        tl.store(out_ptr + offsets, p.to(out_ptr.dtype.element_ty), mask=live)


def adamw_flat(master, grad, exp_avg, exp_avg_sq, out, group_ids, table, coef) -> None:
    """One AdamW step over flat fp32 tensors of equal length (see FlatAdamW)."""
    n = master.numel()
    if n == 0:
        return
    _adamw_flat_kernel[(triton.cdiv(n, BLOCK),)](
        master, grad, exp_avg, exp_avg_sq, master if out is None else out, group_ids, table,
        master if coef is None else coef, n, HAS_OUT=out is not None, HAS_COEF=coef is not None,
        BLOCK=BLOCK, num_warps=8,
    )  # fmt: skip
