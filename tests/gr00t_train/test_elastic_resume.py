"""A checkpoint written at one world size resumes at another (CPU, gloo, ZeRO-1): 1 -> 2 -> 1 and 2 -> 1
continue the reference run's losses within rounding when the global batch is kept, the samples of every step
are the reference's (the global order continues), 2 -> 2 stays bit for bit, and a changed global batch is
warned about and recorded.

Tolerance: with the same global batch (8 = 1 x 8 = 2 x 4) every step sees the same samples and the same
noise (drawn from sample seeds), so only the order of reductions differs: a loss and a gradient are a mean of
8 terms either as one sum or as two sums of 4 averaged across ranks. Each differs by a few fp32 roundings
(u = 2^-24 ~ 6e-8, at most ~8u relative per reduction); Adam's step is scale-free in the gradient, so each step
moves weights by about lr times that relative error. Over 9 steps the losses may drift by up to ~9 x 8u ~ 4e-6
relative: we allow rtol = 1e-5 (and expect far less: the measured drift is printed on failure)."""

from __future__ import annotations

import json
import logging
import shutil
import textwrap
from pathlib import Path

import gr00t_train
import pytest
import torch
from _torchrun import torchrun
from gr00t_train import Trainer
from gr00t_train.checkpoint.resize import stream_seed

STANDINS = Path(__file__).with_name("standins.py")
RTOL = 1e-5

_WORKER = """
import importlib.util, json, sys
from pathlib import Path
import torch
spec = importlib.util.spec_from_file_location("gr00t_train_standins", {standins!r})
standins = importlib.util.module_from_spec(spec); sys.modules[spec.name] = standins; spec.loader.exec_module(standins)
import gr00t_train
torch.set_num_threads(1)
env = gr00t_train.init_distributed("cpu")
out, resume, batch = Path(sys.argv[1]), sys.argv[2], int(sys.argv[3])
cfg = standins.elastic_config(out.parent, out.name, batch, resume)
parts = standins.make_elastic_parts(batch, cfg.seed, env.rank, env.world_size)
gr00t_train.Trainer(cfg, parts, env).fit()
flat = torch.cat([p.detach().flatten() for p in parts.model.parameters()])
torch.save(flat, out / f"params-rank{{env.rank}}.pt")
(out / f"seen-rank{{env.rank}}.json").write_text(json.dumps(parts.data.seen))
(out / f"seed-rank{{env.rank}}.txt").write_text(str(torch.initial_seed()))
gr00t_train.shutdown_distributed(env)
"""


def _losses(run: Path) -> dict[int, float]:
    out = {}
    for line in (run / "metrics.jsonl").read_text().splitlines():
        row = json.loads(line)
        out[row["step"]] = row["loss"]
    return out


def _two_ranks(tmp: Path, name: str, resume: Path, batch: int) -> Path:
    script = tmp / "elastic_worker.py"
    script.write_text(textwrap.dedent(_WORKER.format(standins=str(STANDINS))))
    out = tmp / name
    out.mkdir(exist_ok=True)
    code, output = torchrun(str(script), str(out), str(resume), str(batch), timeout=180)
    assert code == 0, output[-5000:]
    return out


def _one_rank(standins, tmp: Path, name: str, env, batch: int, resume: Path | None, **sets):
    cfg = standins.elastic_config(tmp, name, batch, str(resume) if resume else None, **sets)
    parts = standins.make_elastic_parts(batch, cfg.seed, 0, 1)
    trainer = Trainer(cfg, parts, env)
    trainer.fit()
    return trainer, parts


def _close(a: dict[int, float], b: dict[int, float], steps) -> None:
    drift = max(abs(a[s] - b[s]) / abs(b[s]) for s in steps)
    assert drift <= RTOL, f"losses drift {drift:.2e} relative (allowed {RTOL:g}): {a} vs {b}"


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_resume_at_another_world_size(tmp_path, env, standins, caplog) -> None:
    # The reference: one rank, 8 samples per step, steps 1-9.
    _, ref_parts = _one_rank(standins, tmp_path, "ref", env, 8, None)
    ref = _losses(tmp_path / "ref")
    ref_seen = ref_parts.data.seen
    step3 = tmp_path / "ref" / "checkpoints" / "step_000003"

    # 1 -> 2: two ranks of 4 from step 3 (the same global batch).
    two = _two_ranks(tmp_path, "two", step3, 4)
    elastic = _losses(two)
    assert sorted(elastic) == list(range(4, 10))
    _close(elastic, ref, range(4, 10))
    seen = [json.loads((two / f"seen-rank{r}.json").read_text()) for r in (0, 1)]
    for step in range(6):  # each step's samples are the reference's: the global order continues
        assert sorted(seen[0][step] + seen[1][step]) == sorted(ref_seen[3 + step])
    assert int((two / "seed-rank1.txt").read_text()) == stream_seed(42, 1, 3)  # a new rank's streams
    state = json.loads((two / "checkpoints" / "step_000006" / "trainer_state.json").read_text())
    assert state["world_size"] == 2 and state["samples_seen"] == 48 and state["global_batch"] == 8
    assert {"step": 3, "key": "world_size", "from": 1, "to": 2} in state["resume_changes"]

    # 2 -> 2: bit for bit (a copy of the run resumed from step 6).
    again = tmp_path / "again"
    shutil.copytree(two, again)
    _two_ranks(tmp_path, "again", again / "checkpoints" / "step_000006", 4)
    assert _losses(again) == elastic
    assert torch.equal(torch.load(again / "params-rank0.pt"), torch.load(two / "params-rank0.pt"))

    # 2 -> 1: one rank of 8 from the two ranks' step 6: the reference's losses and samples again.
    back = tmp_path / "back"
    shutil.copytree(two, back)
    with caplog.at_level(logging.WARNING):
        trainer, parts = _one_rank(standins, tmp_path, "back", env, 8, back / "checkpoints" / "step_000006")
    _close(_losses(back), ref, range(7, 10))
    assert [sorted(s) for s in parts.data.seen] == [sorted(s) for s in ref_seen[6:9]]
    assert trainer.samples_seen == 72
    assert "written by 2 process(es), on 1: the global batch stays 8 samples per step" in caplog.text


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_a_changed_global_batch_is_warned_and_recorded(tmp_path, env, standins, caplog) -> None:
    _one_rank(standins, tmp_path, "one", env, 4, None)
    shutil.copytree(tmp_path / "one", tmp_path / "run")
    out = _two_ranks(tmp_path, "run", tmp_path / "run" / "checkpoints" / "step_000003", 4)  # 1 -> 2: 4 -> 8
    state = json.loads((out / "checkpoints" / "step_000009" / "trainer_state.json").read_text())
    assert state["samples_seen"] == 3 * 4 + 6 * 8
    assert state["resume_changes"][-2:] == [
        {"step": 3, "key": "world_size", "from": 1, "to": 2},
        {"step": 3, "key": "global_batch", "from": 4, "to": 8},
    ]
    summary = json.loads((out / "summary.json").read_text())
    assert summary["resume_changes"][-1]["key"] == "global_batch"
    # 2 -> 1 at 4 per rank: the warning names both global batches, before the model is built.
    cfg = standins.elastic_config(tmp_path, "run", 4, str(out / "checkpoints" / "step_000006"))
    with caplog.at_level(logging.WARNING):
        trainer = Trainer(cfg, standins.make_elastic_parts(4, cfg.seed), env)
        trainer.fit()
    assert "written by 2 process(es), on 1: the global batch goes from 8 to 4 samples per step" in caplog.text
    assert trainer.samples_seen == 3 * 4 + 3 * 8 + 3 * 4


def test_the_baseline_loader_cannot_change_world_size(tmp_path, env, standins) -> None:
    cfg = standins.elastic_config(tmp_path, "run", 4, None, steps=2, optimizations__data="dataloader")
    trainer = Trainer(cfg, standins.make_elastic_parts(4, cfg.seed), env)
    trainer.fit()
    state_file = tmp_path / "run" / "checkpoints" / "step_000002" / "trainer_state.json"
    state = json.loads(state_file.read_text())
    state_file.write_text(json.dumps({**state, "world_size": 2}))
    from gr00t_train.checkpoint.manifest import write_manifest

    (state_file.parent / "manifest.json").unlink()
    write_manifest(state_file.parent, {"step": 2, "run_id": state["run_id"]})
    cfg = standins.elastic_config(tmp_path, "run", 4, "auto", steps=2, optimizations__data="dataloader")
    with pytest.raises(gr00t_train.ConfigError, match="optimizations.data: .*written by 2 process"):
        Trainer(cfg, standins.make_elastic_parts(4, cfg.seed), env).fit()


def test_the_saved_ranks_skipped_samples_add_up_on_rank_0(tmp_path) -> None:
    from gr00t_train.checkpoint.resize import resized_data_state

    saved = [
        {"epoch": 1, "batch": 3, "consumed": 24, "world_size": 2, "skipped_samples": 2},
        {"epoch": 1, "batch": 3, "consumed": 24, "world_size": 2, "skipped_samples": 5},
    ]
    assert resized_data_state(saved, 0, tmp_path)["skipped_samples"] == 7
    assert resized_data_state(saved[:1], 2, tmp_path) == {**saved[0], "skipped_samples": 0}
    with pytest.raises(gr00t_train.CheckpointError, match="rank00001.pt and rank00000.pt disagree"):
        resized_data_state([saved[0], {**saved[1], "batch": 4}], 0, tmp_path)
    assert stream_seed(42, 1, 3) == stream_seed(42, 1, 3) != stream_seed(42, 2, 3)
