"""A two-rank ZeRO-1 run with 8-bit AdamW moments (`memory.adam_moments=int8`, CPU, gloo) saves its moments as
stored: rank 0 gathers every rank's codes and block scales, and the background writer decodes them to the
checkpoint's fp32 format. The checkpoint holds fp32 moments per parameter, whole (the format of fp32 runs); a
resume at two ranks continues bit for bit, and at one rank (the same global batch) within the elastic tests'
tolerance.

Tolerance (as tests/gr00t_train/test_elastic_resume.py): rtol = 1e-5 on the losses. At one rank the layout puts
every parameter at the same offset of its bucket as at two (offsets are multiples of 64, buckets padded to 64 per
rank), so the quantization blocks group the same elements: the loaded moments encode back to the saved codes
and scales exactly (the codec is idempotent). What differs is the reduction order of the loss and the gradient
(one sum of 8 terms, or two sums of 4 averaged across ranks), a few fp32 roundings (~8u, u = 2^-24, relative per
reduction), which Adam's scale-free step turns into weight moves of about lr times that relative error: over 3
steps far below 1e-5. The 8-bit moments add one way to amplify it: an element whose moment lies within that
error of a code's rounding edge takes the neighbouring code, a jump of at most 1/127 of the block's largest
|exp_avg| in that element's moment, moving that one weight by a small fraction of one lr step; the loss, an
average over all weights' effects, moves by far less than 1e-5 of itself (the measured drift is printed on
failure)."""

from __future__ import annotations

import json
import shutil
import textwrap
from pathlib import Path

import pytest
import torch
from _torchrun import torchrun
from gr00t_train import Trainer

STANDINS = Path(__file__).with_name("standins.py")
RTOL = 1e-5
INT8 = {"memory__adam_moments": "int8"}

_WORKER = """
import importlib.util, sys
from pathlib import Path
import torch
spec = importlib.util.spec_from_file_location("gr00t_train_standins", {standins!r})
standins = importlib.util.module_from_spec(spec); sys.modules[spec.name] = standins; spec.loader.exec_module(standins)
import gr00t_train
torch.set_num_threads(1)
env = gr00t_train.init_distributed("cpu")
out, resume = Path(sys.argv[1]), sys.argv[2]
cfg = standins.elastic_config(out.parent, out.name, 4, None if resume == "-" else resume, steps=6,
                              memory__adam_moments="int8")
parts = standins.make_elastic_parts(4, cfg.seed, env.rank, env.world_size)
gr00t_train.Trainer(cfg, parts, env).fit()
flat = torch.cat([p.detach().flatten() for p in parts.model.parameters()])
torch.save(flat, out / f"params-rank{{env.rank}}.pt")
gr00t_train.shutdown_distributed(env)
"""


def _losses(run: Path) -> dict[int, float]:
    return {
        row["step"]: row["loss"] for row in map(json.loads, (run / "metrics.jsonl").read_text().splitlines())
    }


def _two_ranks(tmp: Path, name: str, resume: Path | None) -> Path:
    script = tmp / "int8_worker.py"
    script.write_text(textwrap.dedent(_WORKER.format(standins=str(STANDINS))))
    out = tmp / name
    out.mkdir(exist_ok=True)
    code, output = torchrun(str(script), str(out), str(resume) if resume else "-", timeout=180)
    assert code == 0, output[-5000:]
    return out


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_int8_moments_gathered_as_stored_resume_at_two_ranks_and_at_one(tmp_path, env, standins) -> None:
    run = _two_ranks(tmp_path, "run", None)  # steps 1-6, checkpoints at 3 and 6
    ref = _losses(run)
    assert sorted(ref) == list(range(1, 7))
    step3 = run / "checkpoints" / "step_000003"
    summary = json.loads((run / "summary.json").read_text())
    assert len(summary["checkpoint_stall_s"]) == 2 and not summary["checkpoint_failures"]

    # the checkpoint's format is unchanged: fp32 moments per parameter, whole, beside the masters
    saved = torch.load(step3 / "optimizer.pt", weights_only=False)
    shapes = {
        n: p.shape for n, p in standins.make_elastic_parts(4).model.named_parameters() if p.requires_grad
    }
    assert saved["state"].keys() == shapes.keys()
    for name, entry in saved["state"].items():
        assert {"master", "exp_avg", "exp_avg_sq", "step"} <= entry.keys(), name
        for key in ("master", "exp_avg", "exp_avg_sq"):
            assert entry[key].dtype == torch.float32 and entry[key].shape == shapes[name], (name, key)
        assert bool(entry["exp_avg_sq"].gt(0).any()), name  # real moments, not zeros

    # 2 -> 2: bit for bit
    again = tmp_path / "again"
    shutil.copytree(run, again)
    (again / "params-rank0.pt").unlink()  # written again by the resumed run
    _two_ranks(tmp_path, "again", again / "checkpoints" / "step_000003")
    resumed = _losses(again)
    assert {s: resumed[s] for s in range(4, 7)} == {s: ref[s] for s in range(4, 7)}
    assert torch.equal(torch.load(again / "params-rank0.pt"), torch.load(run / "params-rank0.pt"))

    # 2 -> 1: one rank of 8 samples (the same global batch), within the elastic tests' tolerance
    back = tmp_path / "back"
    shutil.copytree(run, back)
    cfg = standins.elastic_config(
        tmp_path, "back", 8, str(back / "checkpoints" / "step_000003"), steps=6, **INT8
    )
    Trainer(cfg, standins.make_elastic_parts(8, cfg.seed), env).fit()
    one = _losses(back)
    drift = max(abs(one[s] - ref[s]) / abs(ref[s]) for s in range(4, 7))
    assert drift <= RTOL, f"losses drift {drift:.2e} relative (allowed {RTOL:g}): {one} vs {ref}"
