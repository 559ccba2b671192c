"""Run by test_remainders.py under TRITON_INTERPRET=1: one flat AdamW step of the Triton kernel with and without
remainders from the same state, and the clipping norm's sum-of-squares kernel on sizes off its blocks; prints
what the tests check, as JSON."""

import json

import torch
from vla_overlap._flat_adamw_kernel import adamw_flat, sum_of_squares
from vla_overlap._remainders import decode, encode_

torch.manual_seed(0)
n, block = 2**20, 1024  # about 16 ties expected among the outputs
master = torch.randn(n) * 0.05
master.view(torch.int32)[:16] = (master.view(torch.int32)[:16] & ~0xFFFF) | 0x8000  # ties to start from
out, rem = torch.empty(n, dtype=torch.bfloat16), torch.empty(n, dtype=torch.int16)
encode_(master, out, rem)  # the remainder run's start; master now holds the moved ties
grad = (torch.randn(n) * 1e-2).to(torch.bfloat16)
m, v = torch.randn(n) * 1e-3, torch.rand(n) * 1e-5
blocks = torch.tensor([[at, block, 0] for at in range(0, n, block)], dtype=torch.int64)
table = torch.tensor([[1 - 1e-3, 0.9, 0.999, 1e-8, 1e-3, 0.3, 0, 0]], dtype=torch.float32)
idle = torch.arange(n // block) % 4 == 3  # every fourth block only decays
plain = dict(master=master.clone(), out=out.clone(), m=m.clone(), v=v.clone())
adamw_flat(plain["master"], grad, plain["m"], plain["v"], plain["out"], blocks, table, None, idle=idle)
kept = dict(master=master.clone(), out=out.clone(), rem=rem.clone(), m=m.clone(), v=v.clone())
adamw_flat(
    kept["master"],
    grad,
    kept["m"],
    kept["v"],
    kept["out"],
    blocks,
    table,
    None,
    idle=idle,
    remainder=kept["rem"],
)
decoded = decode(kept["out"], kept["rem"])
moved = (decoded.view(torch.int32) - plain["master"].view(torch.int32)).abs()
ties = (plain["master"].view(torch.int32) & 0xFFFF) == 0x8000
norm_errors = []  # relative, against float64; sizes off the 4096-element blocks and the 8-block programs
for size in (1, 4095, 4096 * 8, 4096 * 8 * 2 + 17):
    x = torch.randn(size).to(torch.bfloat16)
    exact = x.double().square().sum()
    norm_errors.append(abs(sum_of_squares(x).double().item() - exact.item()) / exact.item())
print(
    json.dumps(
        {
            "master_untouched": torch.equal(kept["master"], master),
            "params_round_plain_masters": torch.equal(kept["out"], plain["master"].to(torch.bfloat16)),
            "moments_equal": torch.equal(kept["m"], plain["m"]) and torch.equal(kept["v"], plain["v"]),
            "moved_only_ties_by_one": bool((moved[~ties] == 0).all() and (moved[ties] == 1).all()),
            "decayed": not torch.equal(plain["master"][3072:4096], master[3072:4096]),
            "ties": int(ties.sum()),
            "norm_errors": norm_errors,
        }
    )
)
