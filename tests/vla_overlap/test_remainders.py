"""fp32 masters kept as bf16 parameter + 16-bit remainder (DistributedAdamW(remainders=True), _remainders):
the codec, the Triton kernel under Triton's interpreter (a fresh process: the interpreter is chosen when kernels
are defined), and the flat step against plain fp32 masters. The only difference allowed is the codec's: a master
at an exact rounding tie moves one fp32 ulp (the bf16 parameter does not change)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from vla_overlap._remainders import decode, encode_


def _ulps(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return (a.view(torch.int32).long() - b.view(torch.int32).long()).abs()


def test_the_codec_round_trips_every_master_but_ties_which_move_one_ulp_keeping_the_rounding() -> None:
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(200_000, generator=gen) * torch.logspace(-30, 30, 200_000)
    bits = x.view(torch.int32)
    bits[:500] = (bits[:500] & ~0xFFFF) | 0x8000  # exact ties, with odd and even high halves, both signs
    master, param = x.clone(), torch.empty(len(x), dtype=torch.bfloat16)
    remainder = torch.empty(len(x), dtype=torch.int16)
    encode_(master, param, remainder)
    assert torch.equal(decode(param, remainder), master)
    assert torch.equal(param, x.to(torch.bfloat16))  # autocast's rounding of the original master
    assert torch.equal(param, master.to(torch.bfloat16))  # ... and of the stored one
    moved = _ulps(master, x)
    ties = (x.view(torch.int32) & 0xFFFF) == 0x8000
    assert ties.sum() >= 500 and bool((moved[ties] == 1).all()) and bool((moved[~ties] == 0).all())
    assert not bool(((remainder.long() & 0xFFFF) == 0x8000).any())  # so decoding is never ambiguous


def test_the_kernel_with_remainders_steps_as_the_plain_kernel() -> None:
    pytest.importorskip("triton")
    script = Path(__file__).with_name("_remainder_kernel_check.py")
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    done = subprocess.run([sys.executable, str(script)], env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    found = json.loads(done.stdout.strip().splitlines()[-1])
    assert found["master_untouched"] and found["moments_equal"] and found["decayed"]
    # the interpreter's own fp32 -> bf16 cast truncates, so the parameters are compared with torch's rounding
    assert found["params_round_plain_masters"]
    assert found["ties"] > 0 and found["moved_only_ties_by_one"]
    # fp32 partial sums then a sum of the partials: each of the ~log2(n) rounding levels adds at most 2^-24
    assert len(found["norm_errors"]) == 4 and max(found["norm_errors"]) < 1e-5, found["norm_errors"]


def test_the_flat_step_with_remainders_follows_plain_masters_and_resumes_exactly(pool) -> None:
    (result,) = pool.run("remainders", 1)
    plain, kept, resumed = result["plain"], result["kept"], result["resumed"]
    assert kept["kept_buckets"] > 0 and kept["params_round_masters"] and resumed["params_round_masters"]
    assert "needs the flat step" in result["without_flat"]
    # A moved tie changes a master by one ulp and its later steps by about as much: a few ulps at most, rarely.
    for a, b in zip(kept["masters"], plain["masters"]):
        moved = _ulps(a, b)
        assert int(moved.max()) <= 4 and int((moved > 0).sum()) <= max(2, a.numel() // 1000)
    for name, value in plain["params"].items():
        assert (kept["params"][name] != value).float().mean() <= 1e-3, name
    torch.testing.assert_close(torch.tensor(kept["norms"]), torch.tensor(plain["norms"]), rtol=1e-4, atol=0)
    # A state dict holds the decoded masters; loading encodes them again: the resumed run is the same run.
    for a, b in zip(resumed["masters"], kept["masters"]):
        assert torch.equal(a, b)
    for name, value in kept["params"].items():
        assert torch.equal(resumed["params"][name], value), name
