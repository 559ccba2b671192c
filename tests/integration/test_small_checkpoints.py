"""Checkpoints of a run that starts from a base write only what training changed; `infer` resolves the base,
`export` writes the complete model, and a resume whose base is gone stops before the model is built."""

from __future__ import annotations

import json
import shutil

import gr00t_model
import pytest
import torch
from gr00t_train.checkpoint.restore import load_pretrained
from gr00t_train.cli import main
from safetensors import safe_open


@pytest.mark.slow
def test_a_run_from_a_base_then_infer_export_and_a_missing_base(
    dataset, tmp_path, train_args, capsys, monkeypatch
) -> None:
    # The base: a checkpoint of a first run (what the release folder is to the 3 B model).
    first = tmp_path / "first"
    assert main(train_args(dataset, first, "steps=2", "checkpoint.every=2")) == 0
    base = tmp_path / "base"
    shutil.copytree(first / "checkpoints" / "step_000002", base)

    out = tmp_path / "run"
    sets = (f"model.checkpoint={base}", "optimizations.comm=zero1_overlap", "optimizations.bf16_weights=on")
    assert main(train_args(dataset, out, "steps=4", "checkpoint.every=2", *sets)) == 0
    step4 = out / "checkpoints" / "step_000004"
    with safe_open(str(step4 / "model.safetensors"), framework="pt") as reader:
        assert list(reader.keys()) == []  # frozen: the base's; trainable: ZeRO-1's fp32 masters
    assert json.loads((step4 / "weights.json").read_text())["base"]["path"] == str(base.resolve())

    # infer rebuilds the model from the base and the masters; an export is the same model, whole.
    capsys.readouterr()
    infer = ["--dataset", str(dataset), "--batches", "1", "--batch-size", "4", "--json"]
    assert main(["infer", "--checkpoint", str(out / "checkpoints"), *infer, str(tmp_path / "a.json")]) == 0
    assert main(["export", str(step4), str(tmp_path / "export")]) == 0
    exported = gr00t_model.from_pretrained(tmp_path / "export")
    rebuilt, _ = load_pretrained(step4)
    assert all(
        torch.equal(a, b) for a, b in zip(exported.state_dict().values(), rebuilt.state_dict().values())
    )
    assert any(p.dtype == torch.bfloat16 and p.requires_grad for p in exported.parameters())
    assert main(["infer", "--checkpoint", str(tmp_path / "export"), *infer, str(tmp_path / "b.json")]) == 0
    a, b = (json.loads((tmp_path / f"{x}.json").read_text()) for x in "ab")
    assert a["mse"] == b["mse"] and a["samples"] == b["samples"] == 4
    assert main(["export", str(step4), str(tmp_path / "export")]) == 2  # never over another folder
    assert "exists and is not an empty folder" in capsys.readouterr().err

    # Without its base the checkpoint cannot resume: one line, exit 2, before any model is built.
    shutil.rmtree(base)

    def refuse(*args, **kwargs):
        raise AssertionError("the model was built before the refusal")

    monkeypatch.setattr("gr00t_train.model.gr00t.build_model", refuse)
    step2 = out / "checkpoints" / "step_000002"
    assert (
        main([*train_args(dataset, out, "steps=4", "checkpoint.every=2", *sets), "--resume", str(step2)]) == 2
    )
    err = capsys.readouterr().err
    assert f"model.checkpoint: {step2}'s frozen weights are those of its base {base.resolve()}" in err
    assert f"but {base} does not exist. Restore the base" in err
