"""The attention calls of an n1.6-3b step (batch 16, two 252x252 cameras) under each SDPA backend.

    PYTHONPATH=<the packages' src folders> python benchmarks/probes/attention_probe.py [--json OUT] [--only a,b]

For every attention shape of the step (SigLIP2's, head dim 72, forward only; the frozen and trainable Qwen3
layers', causal with padding; the DiT's self- and cross-attention) it times, 20 calls in one CUDA graph, the
forward (and forward + backward where the step trains through it) under each backend torch offers (cuDNN,
flash, memory-efficient, math), SigLIP2's head dim zero-padded to 80, 96 and 128 (same result: padded
channels add zero to every score and produce zero outputs), and a compiled flex_attention. Each row gives
the largest difference from an fp32 math reference, so a fast but wrong variant shows. The step total per
variant is the call time times the calls per step. `triton m/n/warps/stages` rows are gr00t-model's own
kernels (`_attention_op`) at those tile sizes, forward and backward; `--only cudnn,efficient,triton` keeps
just the rows whose name holds one of the words.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the shared helpers in benchmarks/
from _cuda_timing import cuda_graph_ms  # noqa: E402

# Tile sizes tried for our Triton kernels: (forward, backward) Blocks(m, n, warps, stages).
TRITON_CONFIGS = [
    ((128, 64, 8, 2), (64, 64, 4, 2)),
    ((128, 64, 4, 3), (64, 32, 4, 2)),
    ((64, 64, 4, 2), (32, 64, 4, 2)),
    ((64, 32, 4, 3), (64, 64, 8, 2)),
    ((128, 32, 4, 2), (128, 64, 8, 2)),
]

BACKENDS = {
    "cudnn": SDPBackend.CUDNN_ATTENTION,
    "flash": SDPBackend.FLASH_ATTENTION,
    "efficient": SDPBackend.EFFICIENT_ATTENTION,
    "math": SDPBackend.MATH,
}
# name: (batch, heads, queries, keys, head dim, mask kind, calls per step forward, of which trained through)
SHAPES = {
    "siglip2": (32, 16, 324, 324, 72, None, 27, 0),
    "qwen3": (16, 16, 204, 204, 128, "causal", 16, 4),
    "dit self": (16, 32, 51, 51, 48, None, 16, 16),
    "dit cross": (16, 32, 51, 204, 48, "keys", 16, 16),
}


def inputs(b, h, q, k, d, mask_kind):
    """(q, k, v), SDPA's boolean mask or None, the [B, keys] valid keys. Qwen3's k and v come in identical head
    pairs, as its 8 key/value heads repeated to 16 are."""
    gen = torch.Generator(device="cuda").manual_seed(0)
    qkv = [torch.randn(b, h, n, d, device="cuda", generator=gen).bfloat16() for n in (q, k, k)]
    valid = torch.ones(b, k, dtype=torch.bool, device="cuda")
    valid[: b // 2, k - k // 5 :] = False  # half the batch padded, as prompts of different lengths are
    if mask_kind == "keys":
        return qkv, valid[:, None, None, :], valid
    if mask_kind == "causal":
        qkv[1:] = [t[:, ::2].repeat_interleave(2, dim=1) for t in qkv[1:]]
        causal = torch.ones(q, k, dtype=torch.bool, device="cuda").tril()
        mask = (causal[None, None] & valid[:, None, None, :]) | torch.eye(
            q, k, dtype=torch.bool, device="cuda"
        )
        return qkv, mask, valid
    return qkv, None, valid


def sdpa_call(backend, mask, pad_to=None, scale=None):
    def call(q, k, v):
        if pad_to:
            q, k, v = (F.pad(t, (0, pad_to - t.shape[-1])) for t in (q, k, v))
        with sdpa_kernel([backend]):
            out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=scale)
        return out

    return call


_PADDED: dict = {}


def padded(pad, *qkv):
    """The inputs zero-padded to `pad` channels once, as a projection with padded weights would write them."""
    key = (pad, *(t.data_ptr() for t in qkv))
    if key not in _PADDED:
        _PADDED[key] = [F.pad(t, (0, pad - t.shape[-1])) for t in qkv]
    return _PADDED[key]


def variants(name, d, mask, valid):
    rows = {f"sdpa {k}": sdpa_call(v, mask) for k, v in BACKENDS.items()}
    if name == "siglip2":
        for pad in (80, 96, 128):
            for k in ("cudnn", "flash"):
                fn = sdpa_call(BACKENDS[k], mask, pad_to=pad, scale=1 / math.sqrt(d))
                rows[f"sdpa {k} padded to {pad}"] = lambda q, k_, v, fn=fn: fn(q, k_, v)[..., :d]
            kernel = sdpa_call(BACKENDS["cudnn"], mask, scale=1 / math.sqrt(d))  # SigLIP2 is forward-only
            rows[f"sdpa cudnn on {pad}-wide inputs (no pad pass)"] = lambda q, k_, v, pad=pad, kernel=kernel: (
                kernel(*padded(pad, q, k_, v))[..., :d]
            )
    rows.update(triton_variants(name, d, valid))
    if mask is None:
        from torch.nn.attention.flex_attention import flex_attention

        rows["flex (compiled)"] = torch.compile(flex_attention, dynamic=False)
    return rows


def triton_variants(name, d, valid):
    """Our kernels at each of TRITON_CONFIGS; Qwen3's also with its real 8 key/value heads (no repeat)."""
    from gr00t_model import _attention_op as op

    kind = SHAPES[name][5]
    key_mask = None if kind is None else valid
    rows = {}
    for fwd, bwd in TRITON_CONFIGS:
        blocks = op.Blocks(*fwd), op.Blocks(*bwd)
        fn = _triton_fn(op, key_mask, kind == "causal", d**-0.5, blocks)
        rows[f"triton {'/'.join(map(str, fwd))} bwd {'/'.join(map(str, bwd))}"] = fn
        if name == "siglip2":  # 72 = 64 + 8 split miscompiled: 80-wide heads (zero weights) as 64 + 16 tiles
            rows[f"triton {'/'.join(map(str, fwd))} on 80-wide inputs"] = lambda q, k, v, fn=fn: fn(
                *padded(80, q, k, v)
            )[..., :d]
        if kind == "causal":
            rows[f"triton gqa8 {'/'.join(map(str, fwd))} bwd {'/'.join(map(str, bwd))}"] = (
                lambda q, k, v, fn=fn: fn(q, k[:, ::2], v[:, ::2])
            )
    return rows


def _triton_fn(op, key_mask, causal, scale, blocks):
    class Attention(torch.autograd.Function):
        @staticmethod
        def forward(ctx, q, k, v):
            out, lse = op.launch_forward(q, k, v, key_mask, causal, scale, blocks[0])
            ctx.save_for_backward(q, k, v, out, lse)
            return out

        @staticmethod
        def backward(ctx, dout):
            q, k, v, out, lse = ctx.saved_tensors
            return op.launch_backward(dout, q, k, v, out, lse, key_mask, causal, scale, blocks[1])

    def call(q, k, v):
        return Attention.apply(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)).transpose(1, 2)

    return call


def time_row(fn, qkv, train: bool):
    if not train:
        with torch.no_grad():
            return cuda_graph_ms(lambda: fn(*qkv))
    leaves = [t.detach().requires_grad_() for t in qkv]
    grad_out = torch.randn_like(fn(*leaves))
    return cuda_graph_ms(lambda: torch.autograd.grad(fn(*leaves), leaves, grad_out))


def probe(only: list[str] | None = None, shapes: list[str] | None = None) -> list[dict]:
    rows = []
    for name in shapes or SHAPES:
        b, h, q, k, d, mask_kind, calls, trained = SHAPES[name]
        qkv, mask, valid = inputs(b, h, q, k, d, mask_kind)
        ref64 = [t.double().requires_grad_() for t in qkv]
        ref = F.scaled_dot_product_attention(*ref64, attn_mask=mask)
        grad_out = torch.randn_like(ref)
        ref_grads = torch.autograd.grad(ref, ref64, grad_out) if trained else ()
        ref = ref.detach().float()
        for variant, fn in variants(name, d, mask, valid).items():
            if only and not any(word in variant for word in only):
                continue
            row = {"shape": name, "variant": variant, "bhqkd": [b, h, q, k, d]}
            try:
                with torch.no_grad():
                    row["max_abs_err"] = (fn(*qkv).float() - ref).abs().max().item()
                if trained and "gqa" not in variant:  # dq, dk, dv against fp64's (gqa: k/v are slices)
                    leaves = [t.detach().requires_grad_() for t in qkv]
                    grads = torch.autograd.grad(fn(*leaves), leaves, grad_out.to(qkv[0].dtype))
                    row["grad_err"] = [(g.double() - r).abs().max().item() for g, r in zip(grads, ref_grads)]
                row["fwd_ms"] = time_row(fn, qkv, train=False)
                if trained:
                    row["fwd_bwd_ms"] = time_row(fn, qkv, train=True)
                row["step_ms"] = (calls - trained) * row["fwd_ms"] + trained * row.get("fwd_bwd_ms", 0.0)
            except Exception as exc:  # noqa: BLE001 (a backend refusing a shape is a result)
                row["error"] = f"{type(exc).__name__}: {str(exc).splitlines()[0][:160]}"
            print(
                json.dumps({k: round(v, 4) if isinstance(v, float) else v for k, v in row.items()}),
                flush=True,
            )
            rows.append(row)
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--json", help="write the rows here")
    parser.add_argument("--only", help="comma-separated words: keep the rows whose name holds one")
    parser.add_argument("--shapes", help="comma-separated shape names, in the order to run them")
    args = parser.parse_args()
    rows = probe(args.only.split(",") if args.only else None, args.shapes.split(",") if args.shapes else None)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(
                {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "rows": rows},
                f,
                indent=1,
            )


if __name__ == "__main__":
    main()
