"""The attention calls of an n1.6-3b step (batch 16, two 252x252 cameras) under each SDPA backend.

    PYTHONPATH=<the packages' src folders> python benchmarks/attention_probe.py [--json OUT]

For every attention shape of the step (SigLIP2's, head dim 72, forward only; the frozen and trainable Qwen3
layers', causal with padding; the DiT's self- and cross-attention) it times, 20 calls in one CUDA graph, the
forward (and forward + backward where the step trains through it) under each backend torch offers (cuDNN,
flash, memory-efficient, math), SigLIP2's head dim zero-padded to 80, 96 and 128 (same result: padded
channels add zero to every score and produce zero outputs), and a compiled flex_attention. Each row gives
the largest difference from an fp32 math reference, so a fast but wrong variant shows. The step total per
variant is the call time times the calls per step.
"""

from __future__ import annotations

import argparse
import json
import math

import torch
import torch.nn.functional as F
from _cuda_timing import cuda_graph_ms
from torch.nn.attention import SDPBackend, sdpa_kernel

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
    gen = torch.Generator(device="cuda").manual_seed(0)
    qkv = [torch.randn(b, h, n, d, device="cuda", generator=gen).bfloat16() for n in (q, k, k)]
    valid = torch.ones(b, k, dtype=torch.bool, device="cuda")
    valid[: b // 2, k - k // 5 :] = False  # half the batch padded, as prompts of different lengths are
    if mask_kind == "keys":
        return qkv, valid[:, None, None, :]
    if mask_kind == "causal":
        causal = torch.ones(q, k, dtype=torch.bool, device="cuda").tril()
        return qkv, (causal[None, None] & valid[:, None, None, :]) | torch.eye(
            q, k, dtype=torch.bool, device="cuda"
        )
    return qkv, None


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


def variants(name, d, mask):
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
    if mask is None:
        from torch.nn.attention.flex_attention import flex_attention

        rows["flex (compiled)"] = torch.compile(flex_attention, dynamic=False)
    return rows


def time_row(fn, qkv, train: bool):
    if not train:
        with torch.no_grad():
            return cuda_graph_ms(lambda: fn(*qkv))
    leaves = [t.detach().requires_grad_() for t in qkv]
    grad_out = torch.randn_like(fn(*leaves))
    return cuda_graph_ms(lambda: torch.autograd.grad(fn(*leaves), leaves, grad_out))


def probe() -> list[dict]:
    rows = []
    for name, (b, h, q, k, d, mask_kind, calls, trained) in SHAPES.items():
        qkv, mask = inputs(b, h, q, k, d, mask_kind)
        ref = F.scaled_dot_product_attention(*(t.double() for t in qkv), attn_mask=mask).float()
        for variant, fn in variants(name, d, mask).items():
            row = {"shape": name, "variant": variant, "bhqkd": [b, h, q, k, d]}
            try:
                with torch.no_grad():
                    row["max_abs_err"] = (fn(*qkv).float() - ref).abs().max().item()
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
    args = parser.parse_args()
    rows = probe()
    if args.json:
        with open(args.json, "w") as f:
            json.dump(
                {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "rows": rows},
                f,
                indent=1,
            )


if __name__ == "__main__":
    main()
