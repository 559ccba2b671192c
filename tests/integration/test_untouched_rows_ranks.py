"""Skipping untouched embodiment rows at two ranks (torchrun, gloo): the ranks' batches use different slots,
so each rank's record must be OR-ed with the other's before the update (ZeRO-1: a rank steps its shard of
every row, and a row touched only on the other rank still has a gradient after the reduction)."""

from __future__ import annotations

import json

import pytest
import torch
from _torchrun import torchrun

_WORKER = r"""
import json, sys
from pathlib import Path
import torch
import gr00t_train
from gr00t_train import _comm
from gr00t_train.model.build import build_parts

_comm._flat_kernel = lambda opts, env: "torch"  # the flat step's torch arithmetic (its Triton kernel needs CUDA)
torch.set_num_threads(1)
out, overrides = Path(sys.argv[1]), json.loads(sys.argv[2])
env = gr00t_train.init_distributed("cpu")
step = gr00t_train.Trainer.microbatch_step
def other_slot_per_rank(self, batch):  # as if each rank's data came from another robot
    return step(self, {**batch, "embodiment_id": batch["embodiment_id"] + 5 * env.rank})
gr00t_train.Trainer.microbatch_step = other_slot_per_rank
try:
    for flag in ("true", "false"):
        sets = [*overrides, f"output_dir={out / flag}", f"optimizations.skip_untouched_rows={flag}"]
        cfg = gr00t_train.load_config(preset="demo", overrides=sets)
        parts = build_parts(cfg, env)
        trainer = gr00t_train.Trainer(cfg, parts, env)
        trainer.fit()
        touched = trainer.model.rows_touched
        torch.save({"weights": {n: p.detach().clone() for n, p in parts.model.named_parameters()},
                    "touched": None if touched is None else touched.clone()}, out / f"{flag}-rank{env.rank}.pt")
finally:
    gr00t_train.shutdown_distributed(env)
"""


@pytest.mark.slow
@pytest.mark.timeout(400)
def test_two_ranks_share_their_row_records_and_follow_the_stepped_trajectory(dataset, tmp_path, train_args):
    # with the DiT's merged linears on, so that their ZeRO-1 shards at two ranks are covered too
    sets = ("steps=3", "precision=bf16", "optimizations.comm=zero1_overlap", "optimizations.graph=per_microbatch",
            "optimizations.bf16_weights=true", "optimizations.grouped_embodiment_gemms=on",
            "optimizations.merged_dit_linears=on")  # fmt: skip
    overrides = [s for s in train_args(dataset, tmp_path, *sets)[4::2] if not s.startswith("output_dir=")]
    script = tmp_path / "worker.py"
    script.write_text(_WORKER)
    code, output = torchrun(str(script), str(tmp_path), json.dumps(overrides), timeout=360)
    assert code == 0, output[-5000:]

    runs = {
        (flag, rank): torch.load(tmp_path / f"{flag}-rank{rank}.pt")
        for flag in ("true", "false")
        for rank in (0, 1)
    }
    for rank in (0, 1):
        touched = runs["true", rank]["touched"]
        assert runs["false", rank]["touched"] is None
        # one slot per rank, both in every rank's record: the records were OR-ed
        assert touched is not None and int(touched.sum()) == 2, touched.nonzero().flatten().tolist()
        assert torch.equal(touched, runs["true", 0]["touched"])
        skipped, stepped = runs["true", rank]["weights"], runs["false", rank]["weights"]
        different = [name for name, value in skipped.items() if not torch.equal(value, stepped[name])]
        assert not different, different  # bitwise: what is skipped would have added zeros
        assert all(torch.equal(value, runs["true", 0]["weights"][name]) for name, value in skipped.items())
