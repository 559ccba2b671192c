"""The Triton kernels of _attention: flash attention (online softmax, the scores never in memory) for short
sequences, forward and backward.

Tensors are [B, S, H, D] with any strides but the last (1). A head dim that is not a power of two is split into
two column tiles, D1 (the largest power of two <= D) and D2 (the rest, padded to a power of two >= 16), so 72
runs as 64 + 16 and 48 as 32 + 16 instead of padding to 128 and 64. Scores are kept in base 2 (exp2); LSE is
stored in those units. A row with no allowed key gives a zero output and zero gradients.
"""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def _allowed(rows, cols, lk, keep_ptr, HAS_MASK: tl.constexpr, CAUSAL: tl.constexpr):
    """[M, N] bool: key j exists, is not masked out and (causal) j <= i; causal rows always see themselves."""
    ok = (cols < lk)[None, :]
    if HAS_MASK:
        keep = tl.load(keep_ptr + cols, mask=cols < lk, other=0) != 0
        ok = ok & keep[None, :]
    if CAUSAL:
        ok = (ok & (cols[None, :] <= rows[:, None])) | (cols[None, :] == rows[:, None])
    return ok


@triton.jit
def _tile(base, at, stride, lim, cols_d, dim):
    """[len(at), len(cols_d)] tile of rows `at` (< lim) and head-dim columns cols_d (< dim), zeros outside."""
    return tl.load(
        base + at[:, None] * stride + cols_d[None, :],
        mask=(at[:, None] < lim) & (cols_d[None, :] < dim),
        other=0.0,
    )


@triton.jit
def _forward_kernel(
    Q, K, V, OUT, LSE, KEEP,
    sqb, sqs, sqh, skb, sks, skh, svb, svs, svh, sob, sos, soh, smb,
    heads, groups, lq, lk, dim,
    SCALE2: tl.constexpr, D1: tl.constexpr, D2: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    HAS_MASK: tl.constexpr, CAUSAL: tl.constexpr,
):  # fmt: skip
    pid_m, bh = tl.program_id(0), tl.program_id(1)
    b, h = bh // heads, bh % heads
    rows = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    d1 = tl.arange(0, D1)
    q_base, k_base, v_base = (
        Q + b * sqb + h * sqh,
        K + b * skb + (h // groups) * skh,
        V + b * svb + (h // groups) * svh,
    )
    keep_ptr = KEEP + b * smb
    q1 = _tile(q_base, rows, sqs, lq, d1, dim)
    acc1 = tl.zeros([BLOCK_M, D1], tl.float32)
    if D2 > 0:
        d2 = D1 + tl.arange(0, D2)
        q2 = _tile(q_base, rows, sqs, lq, d2, dim)
        acc2 = tl.zeros([BLOCK_M, D2], tl.float32)
    m = tl.full([BLOCK_M], float("-inf"), tl.float32)
    denom = tl.zeros([BLOCK_M], tl.float32)
    hi = lk
    if CAUSAL:
        hi = tl.minimum(lk, (pid_m + 1) * BLOCK_M)
    for start in range(0, hi, BLOCK_N):
        cols = start + tl.arange(0, BLOCK_N)
        s = tl.dot(q1, tl.trans(_tile(k_base, cols, sks, lk, d1, dim)))
        if D2 > 0:
            s = tl.dot(q2, tl.trans(_tile(k_base, cols, sks, lk, d2, dim)), s)
        s = tl.where(_allowed(rows, cols, lk, keep_ptr, HAS_MASK, CAUSAL), s * SCALE2, float("-inf"))
        m_new = tl.maximum(m, tl.max(s, 1))
        shift = tl.where(m_new == float("-inf"), 0.0, m_new)  # rows with nothing allowed yet
        alpha = tl.exp2(m - shift)
        p = tl.exp2(s - shift[:, None])
        denom = denom * alpha + tl.sum(p, 1)
        p = p.to(Q.dtype.element_ty)
        acc1 = tl.dot(p, _tile(v_base, cols, svs, lk, d1, dim), acc1 * alpha[:, None])
        if D2 > 0:
            acc2 = tl.dot(p, _tile(v_base, cols, svs, lk, d2, dim), acc2 * alpha[:, None])
        m = m_new
    inv = tl.where(denom > 0, 1.0 / denom, 0.0)
    o_at = OUT + b * sob + h * soh + rows[:, None] * sos
    tl.store(o_at + d1[None, :], (acc1 * inv[:, None]).to(OUT.dtype.element_ty), mask=rows[:, None] < lq)
    if D2 > 0:
        tl.store(
            o_at + d2[None, :],
            (acc2 * inv[:, None]).to(OUT.dtype.element_ty),
            mask=(rows[:, None] < lq) & (d2[None, :] < dim),
        )
    lse = tl.where(denom > 0, m + tl.log2(denom), float("inf"))  # inf: exp2(s - lse) = 0 in the backward
    tl.store(LSE + bh * lq + rows, lse, mask=rows < lq)


@triton.jit
def _delta(do_base, o_base, rows, sds, sos, lq, d1, dim, D2: tl.constexpr, d2):
    """rowsum(dO * OUT) per query row, fp32."""
    do1 = _tile(do_base, rows, sds, lq, d1, dim).to(tl.float32)
    delta = tl.sum(do1 * _tile(o_base, rows, sos, lq, d1, dim).to(tl.float32), 1)
    if D2 > 0:
        do2 = _tile(do_base, rows, sds, lq, d2, dim).to(tl.float32)
        delta += tl.sum(do2 * _tile(o_base, rows, sos, lq, d2, dim).to(tl.float32), 1)
    return delta


@triton.jit
def _key_grads_kernel(
    Q, K, V, OUT, DO, LSE, KEEP, DK, DV,
    sqb, sqs, sqh, skb, sks, skh, svb, svs, svh, sob, sos, soh, sdb, sds, sdh, smb, sgb, sgs, sgh,
    heads, groups, lq, lk, dim,
    SCALE: tl.constexpr, SCALE2: tl.constexpr, D1: tl.constexpr, D2: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    HAS_MASK: tl.constexpr, CAUSAL: tl.constexpr,
):  # fmt: skip
    """dK and dV of one key block of one key/value head, summed over its query heads (no atomics)."""
    pid_n, bhk = tl.program_id(0), tl.program_id(1)
    kv_heads = heads // groups
    b, hk = bhk // kv_heads, bhk % kv_heads
    cols = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    d1 = tl.arange(0, D1)
    k_base, v_base = K + b * skb + hk * skh, V + b * svb + hk * svh
    keep_ptr = KEEP + b * smb
    k1, v1 = _tile(k_base, cols, sks, lk, d1, dim), _tile(v_base, cols, svs, lk, d1, dim)
    dk1 = tl.zeros([BLOCK_N, D1], tl.float32)
    dv1 = tl.zeros([BLOCK_N, D1], tl.float32)
    d2 = d1  # unused unless D2 > 0
    if D2 > 0:
        d2 = D1 + tl.arange(0, D2)
        k2, v2 = _tile(k_base, cols, sks, lk, d2, dim), _tile(v_base, cols, svs, lk, d2, dim)
        dk2 = tl.zeros([BLOCK_N, D2], tl.float32)
        dv2 = tl.zeros([BLOCK_N, D2], tl.float32)
    lo = 0
    if CAUSAL:
        lo = (pid_n * BLOCK_N // BLOCK_M) * BLOCK_M
    for g in range(groups):
        h = hk * groups + g
        q_base, o_base, do_base = Q + b * sqb + h * sqh, OUT + b * sob + h * soh, DO + b * sdb + h * sdh
        for start in range(lo, lq, BLOCK_M):
            rows = start + tl.arange(0, BLOCK_M)
            q1, do1 = _tile(q_base, rows, sqs, lq, d1, dim), _tile(do_base, rows, sds, lq, d1, dim)
            s = tl.dot(q1, tl.trans(k1))
            dp = tl.dot(do1, tl.trans(v1))
            if D2 > 0:
                q2, do2 = _tile(q_base, rows, sqs, lq, d2, dim), _tile(do_base, rows, sds, lq, d2, dim)
                s = tl.dot(q2, tl.trans(k2), s)
                dp = tl.dot(do2, tl.trans(v2), dp)
            lse = tl.load(LSE + (b * heads + h) * lq + rows, mask=rows < lq, other=float("inf"))
            ok = _allowed(rows, cols, lk, keep_ptr, HAS_MASK, CAUSAL)
            p = tl.where(ok, tl.exp2(s * SCALE2 - lse[:, None]), 0.0)
            delta = _delta(do_base, o_base, rows, sds, sos, lq, d1, dim, D2, d2)
            ds = (p * (dp - delta[:, None])).to(Q.dtype.element_ty)
            p = p.to(Q.dtype.element_ty)
            dv1 = tl.dot(tl.trans(p), do1, dv1)
            dk1 = tl.dot(tl.trans(ds), q1, dk1)
            if D2 > 0:
                dv2 = tl.dot(tl.trans(p), do2, dv2)
                dk2 = tl.dot(tl.trans(ds), q2, dk2)
    at = cols[:, None] * sgs  # DK and DV share one layout (strides sg*)
    kmask = cols[:, None] < lk
    dk_base, dv_base = DK + b * sgb + hk * sgh, DV + b * sgb + hk * sgh
    tl.store(dk_base + at + d1[None, :], (dk1 * SCALE).to(DK.dtype.element_ty), mask=kmask)
    tl.store(dv_base + at + d1[None, :], dv1.to(DV.dtype.element_ty), mask=kmask)
    if D2 > 0:
        dmask = kmask & (d2[None, :] < dim)
        tl.store(dk_base + at + d2[None, :], (dk2 * SCALE).to(DK.dtype.element_ty), mask=dmask)
        tl.store(dv_base + at + d2[None, :], dv2.to(DV.dtype.element_ty), mask=dmask)


@triton.jit
def _query_grads_kernel(
    Q, K, V, OUT, DO, LSE, KEEP, DQ,
    sqb, sqs, sqh, skb, sks, skh, svb, svs, svh, sob, sos, soh, sdb, sds, sdh, smb,
    heads, groups, lq, lk, dim,
    SCALE: tl.constexpr, SCALE2: tl.constexpr, D1: tl.constexpr, D2: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    HAS_MASK: tl.constexpr, CAUSAL: tl.constexpr,
):  # fmt: skip
    """dQ of one query block of one head; DQ is laid out as OUT."""
    pid_m, bh = tl.program_id(0), tl.program_id(1)
    b, h = bh // heads, bh % heads
    rows = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    d1 = tl.arange(0, D1)
    q_base, o_base, do_base = Q + b * sqb + h * sqh, OUT + b * sob + h * soh, DO + b * sdb + h * sdh
    k_base, v_base = K + b * skb + (h // groups) * skh, V + b * svb + (h // groups) * svh
    keep_ptr = KEEP + b * smb
    q1, do1 = _tile(q_base, rows, sqs, lq, d1, dim), _tile(do_base, rows, sds, lq, d1, dim)
    dq1 = tl.zeros([BLOCK_M, D1], tl.float32)
    d2 = d1  # unused unless D2 > 0
    if D2 > 0:
        d2 = D1 + tl.arange(0, D2)
        q2, do2 = _tile(q_base, rows, sqs, lq, d2, dim), _tile(do_base, rows, sds, lq, d2, dim)
        dq2 = tl.zeros([BLOCK_M, D2], tl.float32)
    lse = tl.load(LSE + bh * lq + rows, mask=rows < lq, other=float("inf"))
    delta = _delta(do_base, o_base, rows, sds, sos, lq, d1, dim, D2, d2)
    hi = lk
    if CAUSAL:
        hi = tl.minimum(lk, (pid_m + 1) * BLOCK_M)
    for start in range(0, hi, BLOCK_N):
        cols = start + tl.arange(0, BLOCK_N)
        k1 = _tile(k_base, cols, sks, lk, d1, dim)
        s = tl.dot(q1, tl.trans(k1))
        dp = tl.dot(do1, tl.trans(_tile(v_base, cols, svs, lk, d1, dim)))
        if D2 > 0:
            k2 = _tile(k_base, cols, sks, lk, d2, dim)
            s = tl.dot(q2, tl.trans(k2), s)
            dp = tl.dot(do2, tl.trans(_tile(v_base, cols, svs, lk, d2, dim)), dp)
        ok = _allowed(rows, cols, lk, keep_ptr, HAS_MASK, CAUSAL)
        p = tl.where(ok, tl.exp2(s * SCALE2 - lse[:, None]), 0.0)
        ds = (p * (dp - delta[:, None])).to(Q.dtype.element_ty)
        dq1 = tl.dot(ds, k1, dq1)
        if D2 > 0:
            dq2 = tl.dot(ds, k2, dq2)
    at = DQ + b * sob + h * soh + rows[:, None] * sos
    tl.store(at + d1[None, :], (dq1 * SCALE).to(DQ.dtype.element_ty), mask=rows[:, None] < lq)
    if D2 > 0:
        dmask = (rows[:, None] < lq) & (d2[None, :] < dim)
        tl.store(at + d2[None, :], (dq2 * SCALE).to(DQ.dtype.element_ty), mask=dmask)


@triton.jit
def _short_grads_kernel(
    Q, K, V, OUT, DO, LSE, KEEP, DQ, DK, DV,
    sqb, sqs, sqh, skb, sks, skh, svb, svs, svh, sob, sos, soh, sdb, sds, sdh, smb, sgb, sgs, sgh,
    heads, groups, lq, lk, dim,
    SCALE: tl.constexpr, SCALE2: tl.constexpr, D1: tl.constexpr, D2: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    HAS_MASK: tl.constexpr, CAUSAL: tl.constexpr,
):  # fmt: skip
    """dQ, dK and dV of one head in one program, where all queries fit one tile (lq <= BLOCK_M) and every
    query head has its own key/value head: each key block's dK and dV are then complete after one pass, and
    dQ sums over the blocks in registers. One launch instead of two, and no score is recomputed."""
    bh = tl.program_id(0)
    b, h = bh // heads, bh % heads
    rows = tl.arange(0, BLOCK_M)
    d1 = tl.arange(0, D1)
    q_base, o_base, do_base = Q + b * sqb + h * sqh, OUT + b * sob + h * soh, DO + b * sdb + h * sdh
    k_base, v_base = K + b * skb + h * skh, V + b * svb + h * svh
    dk_base, dv_base = DK + b * sgb + h * sgh, DV + b * sgb + h * sgh
    keep_ptr = KEEP + b * smb
    q1, do1 = _tile(q_base, rows, sqs, lq, d1, dim), _tile(do_base, rows, sds, lq, d1, dim)
    dq1 = tl.zeros([BLOCK_M, D1], tl.float32)
    d2 = d1  # unused unless D2 > 0
    if D2 > 0:
        d2 = D1 + tl.arange(0, D2)
        q2, do2 = _tile(q_base, rows, sqs, lq, d2, dim), _tile(do_base, rows, sds, lq, d2, dim)
        dq2 = tl.zeros([BLOCK_M, D2], tl.float32)
    lse = tl.load(LSE + bh * lq + rows, mask=rows < lq, other=float("inf"))
    delta = _delta(do_base, o_base, rows, sds, sos, lq, d1, dim, D2, d2)
    for start in range(0, lk, BLOCK_N):
        cols = start + tl.arange(0, BLOCK_N)
        k1, v1 = _tile(k_base, cols, sks, lk, d1, dim), _tile(v_base, cols, svs, lk, d1, dim)
        s = tl.dot(q1, tl.trans(k1))
        dp = tl.dot(do1, tl.trans(v1))
        if D2 > 0:
            k2, v2 = _tile(k_base, cols, sks, lk, d2, dim), _tile(v_base, cols, svs, lk, d2, dim)
            s = tl.dot(q2, tl.trans(k2), s)
            dp = tl.dot(do2, tl.trans(v2), dp)
        ok = _allowed(rows, cols, lk, keep_ptr, HAS_MASK, CAUSAL)
        p = tl.where(ok, tl.exp2(s * SCALE2 - lse[:, None]), 0.0)
        ds = (p * (dp - delta[:, None])).to(Q.dtype.element_ty)
        p = p.to(Q.dtype.element_ty)
        at, kmask = cols[:, None] * sgs, cols[:, None] < lk
        tl.store(dv_base + at + d1[None, :], tl.dot(tl.trans(p), do1).to(DV.dtype.element_ty), mask=kmask)
        dk1 = tl.dot(tl.trans(ds), q1) * SCALE
        tl.store(dk_base + at + d1[None, :], dk1.to(DK.dtype.element_ty), mask=kmask)
        dq1 = tl.dot(ds, k1, dq1)
        if D2 > 0:
            dmask = kmask & (d2[None, :] < dim)
            tl.store(dv_base + at + d2[None, :], tl.dot(tl.trans(p), do2).to(DV.dtype.element_ty), mask=dmask)
            dk2 = tl.dot(tl.trans(ds), q2) * SCALE
            tl.store(dk_base + at + d2[None, :], dk2.to(DK.dtype.element_ty), mask=dmask)
            dq2 = tl.dot(ds, k2, dq2)
    at = DQ + b * sob + h * soh + rows[:, None] * sos
    tl.store(at + d1[None, :], (dq1 * SCALE).to(DQ.dtype.element_ty), mask=rows[:, None] < lq)
    if D2 > 0:
        dmask = (rows[:, None] < lq) & (d2[None, :] < dim)
        tl.store(at + d2[None, :], (dq2 * SCALE).to(DQ.dtype.element_ty), mask=dmask)
