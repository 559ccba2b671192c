"""Run by test_moments8_step.py under TRITON_INTERPRET=1: three flat AdamW steps with 8-bit moments by the Triton
kernel and by the torch form (_moments8.torch_step8) from the same state (runs of two table rows, padding, idle
blocks, clipping, with and without remainders); prints, as JSON, whether they agree bit for bit."""

import json

import torch
from vla_overlap._flat_adamw import plan_blocks
from vla_overlap._moments8 import allocate, encode_moment_, torch_step8
from vla_overlap._moments8_kernel import adamw8_flat
from vla_overlap._remainders import encode_

torch.manual_seed(0)
length = 6 * 1024
runs = [(0, 2500, 0), (2560, 4000, 1), (4096, 6000, 0)]  # gaps: the layout's zero padding
blocks, align = plan_blocks(runs, length)
assert align == 64
gaps = torch.ones(length, dtype=torch.bool)
for start, end, _ in runs:
    gaps[start:end] = False
scale = torch.logspace(-8, 2, length)[torch.randperm(length)]  # many magnitudes in one bucket


def fresh(remainders: bool) -> dict:
    gen = torch.Generator().manual_seed(1)
    flat = {"master": torch.randn(length, generator=gen) * 0.1, "runs": runs, "blocks": torch.tensor(blocks)}
    flat["grad"] = (torch.randn(length, generator=gen) * scale).bfloat16()
    flat["master"][gaps], flat["grad"][gaps] = 0, 0
    allocate(flat)
    m = torch.randn(length, generator=gen) * scale * 0.1
    v = torch.rand(length, generator=gen) * scale**2 * 0.01
    m[gaps], v[gaps] = 0, 0
    encode_moment_(flat, "exp_avg", slice(0, length), m)
    encode_moment_(flat, "exp_avg_sq", slice(0, length), v)
    flat["out"] = flat["master"].bfloat16()
    flat["rem"] = None
    if remainders:
        flat["rem"] = torch.empty(length, dtype=torch.int16)
        encode_(flat["master"], flat["out"], flat["rem"])
    return flat


table = torch.tensor([[1 - 1e-3 * 0.1, 0.9, 0.999, 1e-8, 1e-3 / 0.1, (1 - 0.999) ** 0.5, 0, 0],
                      [1.0, 0.8, 0.99, 1e-6, 2e-3 / 0.2, (1 - 0.99) ** 0.5, 0, 0]])  # fmt: skip
coef = torch.tensor(0.5)
found = {}
for remainders in (False, True):
    for with_idle in (False, True):
        ours, ref = fresh(remainders), fresh(remainders)
        idle = None
        if with_idle:
            idle = torch.arange(len(blocks)) % 3 == 1
            for flat in (ours, ref):
                for (start, size, _), skip in zip(blocks, idle.tolist()):
                    if skip:
                        for key in ("grad", "exp_avg", "exp_avg_sq"):
                            flat[key][start : start + size] = 0
                        flat["exp_avg_scale"][start // 64 : (start + size) // 64] = 0
                        flat["exp_avg_sq_scale"][start // 64 : (start + size) // 64] = 0
        for _ in range(3):
            adamw8_flat(ours["master"], ours["grad"], ours["exp_avg"], ours["exp_avg_sq"], ours["exp_avg_scale"],
                        ours["exp_avg_sq_scale"], ours["out"], ours["blocks"], table, coef, idle=idle,
                        remainder=ours["rem"])  # fmt: skip
            torch_step8(ref, table, coef, idle)
        keys = ["master", "exp_avg", "exp_avg_sq", "exp_avg_scale", "exp_avg_sq_scale"]
        keys += ["rem"] if remainders else []
        name = f"remainders={remainders} idle={with_idle}"
        found[name] = {key: torch.equal(ours[key], ref[key]) for key in keys}
        # the interpreter's fp32 -> bf16 cast truncates: the plain path's bf16 copy is not compared here
        found[name]["moved"] = not torch.equal(ours["exp_avg"], fresh(remainders)["exp_avg"])
        found[name]["nonzero_codes"] = int(ours["exp_avg_sq"].ne(0).sum())
print(json.dumps(found))
