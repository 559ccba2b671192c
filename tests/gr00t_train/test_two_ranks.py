"""Two processes under torchrun on CPU (gloo): same code path as one GPU per process with NCCL."""

from __future__ import annotations

import json
import logging
import textwrap
from pathlib import Path

import gr00t_train
import pytest
import torch
from _torchrun import torchrun

STANDINS = Path(__file__).with_name("standins.py")

_WORKER = """
import importlib.util, sys
from pathlib import Path
import torch
spec = importlib.util.spec_from_file_location("gr00t_train_standins", {standins!r})
standins = importlib.util.module_from_spec(spec); sys.modules[spec.name] = standins; spec.loader.exec_module(standins)
import gr00t_train
torch.set_num_threads(1)
env = gr00t_train.init_distributed("cpu")
overrides = dict(steps=6, checkpoint__every=3, logging__every=2, optimizations__comm="zero1_overlap",
                 logging__peak_tflops="1e-6")
if len(sys.argv) > 1:
    overrides["checkpoint__resume"] = sys.argv[1]
cfg = standins.small_config(Path({tmp!r}), **overrides)
parts = standins.make_parts(rank=env.rank)
trainer = gr00t_train.Trainer(cfg, parts, env)
trainer.fit()
flat = torch.cat([p.detach().flatten() for p in parts.model.parameters()])
torch.save(flat, Path({tmp!r}) / f"params-rank{{env.rank}}.pt")
gr00t_train.shutdown_distributed(env)
"""


def _standin_flops_per_sample() -> float:
    import importlib.util

    spec = importlib.util.spec_from_file_location("gr00t_train_standins_flops", STANDINS)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.make_parts().flops_per_sample


def _torchrun(script: Path, *args: str) -> None:
    code, output = torchrun(str(script), *args, timeout=120)
    assert code == 0, output[-5000:]


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_two_rank_run_checkpoints_and_resumes(tmp_path, env, standins, caplog) -> None:
    script = tmp_path / "worker.py"
    script.write_text(textwrap.dedent(_WORKER.format(standins=str(STANDINS), tmp=str(tmp_path))))
    _torchrun(script)
    a, b = (torch.load(tmp_path / f"params-rank{r}.pt") for r in (0, 1))
    assert torch.equal(a, b)  # data-parallel ranks end with identical weights
    run = tmp_path / "run"
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == list(range(1, 7))  # written once, by rank 0
    flops = _standin_flops_per_sample()
    for row in rows:  # samples/s counts both ranks' samples, so the peak is both ranks' (1e6 FLOP/s each)
        assert row["mfu"] == pytest.approx(row["samples_per_s"] * flops / 2e6)
    ck = run / "checkpoints" / "step_000003"
    assert {p.name for p in ck.iterdir()} >= {
        "rank00000.pt",
        "rank00001.pt",
        "optimizer.pt",
        "model.safetensors",
    }
    state = json.loads((ck / "trainer_state.json").read_text())
    assert state["world_size"] == 2 and state["global_batch"] == 8
    # Each rank kept its own data position and random state.
    r0, r1 = (torch.load(ck / f"rank0000{r}.pt", weights_only=True) for r in (0, 1))
    assert r0["data"] == r1["data"] == {"position": 3}
    assert not torch.equal(r0["rng"]["torch_cpu"], r1["rng"]["torch_cpu"])

    # Resume both ranks from step 3: the same final weights as the uninterrupted run, bit for bit.
    _torchrun(script, str(ck))
    assert torch.equal(torch.load(tmp_path / "params-rank0.pt"), a)
    assert torch.equal(torch.load(tmp_path / "params-rank1.pt"), a)

    # At another world size the run continues (test_elastic_resume.py follows its trajectory and data order);
    # a warning names the global batch before and after.
    cfg = standins.small_config(
        tmp_path, steps=6, checkpoint__resume=str(ck), optimizations__comm="zero1_overlap"
    )
    with caplog.at_level(logging.WARNING):
        trainer = gr00t_train.Trainer(cfg, standins.make_parts(), env)
        trainer.fit()
    assert "written by 2 process(es), on 1: the global batch goes from 8 to 4 samples" in caplog.text
    assert trainer.step == 6 and trainer.samples_seen == 3 * 8 + 3 * 4
