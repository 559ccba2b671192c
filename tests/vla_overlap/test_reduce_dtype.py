"""bf16 gradient reduction with fp32 accumulation (OverlapConfig.reduce_dtype): every rank ends with exactly
the bf16-on-the-wire mean of the ranks' fp32 gradients, for all-reduce and for ZeRO-1's reduce-scatter."""

from __future__ import annotations

import pytest


@pytest.mark.parametrize("sharded", [False, True])
def test_bf16_wire_mean(pool, sharded: bool) -> None:
    assert all(result["ok"] for result in pool.run("bf16_wire", 2, sharded=sharded))
