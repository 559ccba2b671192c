"""The memory predictor's states at two ranks (torchrun, gloo): ZeRO-1's shards per rank, byte for byte."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import pytest
from _torchrun import torchrun

STANDINS = Path(__file__).with_name("standins.py")

_WORKER = """
import importlib.util, json, sys
from pathlib import Path
import torch
spec = importlib.util.spec_from_file_location("gr00t_train_standins", {standins!r})
standins = importlib.util.module_from_spec(spec); sys.modules[spec.name] = standins; spec.loader.exec_module(standins)
import gr00t_train
from gr00t_train.memory.plan import state_bytes
torch.set_num_threads(1)
env = gr00t_train.init_distributed("cpu")
cfg = standins.small_config(Path({tmp!r}) / f"rank{{env.rank}}", steps=1, optimizations__comm="zero1_overlap",
                            checkpoint__save_final="false")
parts = standins.make_parts(rank=env.rank)
trainer = gr00t_train.Trainer(cfg, parts, env)
trainer.fit()
wrapper, optimizer = trainer.comm.module, trainer.comm.optimizer
moments = {{}}
for state in optimizer.state.values():
    for key in ("exp_avg", "exp_avg_sq"):
        moments[state[key].untyped_storage().data_ptr()] = state[key].untyped_storage().nbytes()
allocated = {{
    "trainable_weights": sum(t.numel() * t.element_size() for t in wrapper._gather.data),
    "gradients": sum(t.numel() * t.element_size() for t in wrapper._grads.data),
    "moments": sum(moments.values()),
}}
predicted = state_bytes(parts.model, trainer.cfg, world_size=2, device_type="cpu", moments="fp32")
out = Path({tmp!r}) / f"states-rank{{env.rank}}.json"
out.write_text(json.dumps({{"allocated": allocated, "predicted": predicted}}))
gr00t_train.shutdown_distributed(env)
"""


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_two_rank_states_are_each_ranks_tensors(tmp_path) -> None:
    """Weights and gradient buffers are whole on every rank; the moments are the rank's shard (torch's
    AdamW over its parameter pieces): the prediction is the larger rank's, and equals it byte for byte."""
    script = tmp_path / "worker.py"
    script.write_text(textwrap.dedent(_WORKER.format(standins=str(STANDINS), tmp=str(tmp_path))))
    code, output = torchrun(str(script), timeout=240)
    assert code == 0, output[-5000:]
    ranks = [json.loads((tmp_path / f"states-rank{r}.json").read_text()) for r in (0, 1)]
    predicted = ranks[0]["predicted"]
    assert ranks[1]["predicted"] == predicted
    for key in ("trainable_weights", "gradients"):
        assert all(r["allocated"][key] == predicted[key] for r in ranks), key
    assert predicted["moments"] == max(r["allocated"]["moments"] for r in ranks)
    assert min(r["allocated"]["moments"] for r in ranks) > 0
