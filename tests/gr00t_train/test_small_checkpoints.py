"""Checkpoints write only what training changed (tiny GR00T model, CPU): frozen weights are read from the base
the run started from (recorded by path and hash), trainable weights with fp32 masters in the optimizer state
are derived from them; resumes stay bit-exact, a missing or changed base is refused, and the full model is
rebuilt from the parts."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import gr00t_model
import gr00t_train
import pytest
import torch
from _gr00t_sources import DummySource
from gr00t_train import ConfigError, Trainer
from gr00t_train.checkpoint.restore import load_pretrained
from gr00t_train.model import gr00t as adapter
from safetensors import safe_open

CPU = torch.device("cpu")


@pytest.fixture(scope="module")
def tokenizer():
    return gr00t_model.load_tokenizer(None)


def _cfg(tmp: Path, *overrides: str):
    base = gr00t_train.load_config(
        preset="demo",
        overrides=[
            "device=cpu", f"output_dir={tmp / 'run'}", "logging.progress=false", "logging.plots=false",
            "logging.every=1", "data.batch_size=2", "steps=4", "checkpoint.every=2", "checkpoint.keep_last=5",
        ],
    )  # fmt: skip
    return gr00t_train.apply_overrides(base, list(overrides))


def _parts(cfg, tokenizer):
    model = adapter.build_model(cfg, CPU, tokenizer)
    return gr00t_train.TrainParts(
        model=model,
        loss_fn=adapter.gr00t_loss,
        data=DummySource(model.config, cfg.data.batch_size),
        save_model=adapter.save_model,
        load_model=adapter.load_model_in_place,
        draw=adapter.make_draw(model, cfg.data.batch_size, CPU),
        base=adapter.base_weights(model),
    )


@pytest.fixture(scope="module")
def base(tmp_path_factory, tokenizer) -> Path:
    """A save_pretrained folder of the tiny model (what a release folder is to the 3 B model)."""
    folder = tmp_path_factory.mktemp("base")
    cfg = _cfg(folder)
    adapter.save_model(adapter.build_model(cfg, CPU, tokenizer), folder)
    (folder / "train_config.json").write_text(json.dumps(gr00t_train.config_to_dict(cfg)))  # its tokenizer
    return folder


def _tensors(file: Path) -> dict[str, torch.Tensor]:
    with safe_open(str(file), framework="pt") as reader:
        return {k: reader.get_tensor(k) for k in reader.keys()}  # noqa: SIM118


def _losses(run: Path) -> list[float]:
    return [json.loads(line)["loss"] for line in (run / "metrics.jsonl").open()]


def _bytes(folder: Path) -> int:
    return sum(p.stat().st_size for p in folder.rglob("*") if p.is_file())


ZERO1_BF16 = ("optimizations.comm=zero1_overlap", "optimizations.bf16_weights=on")


def test_a_run_from_a_base_writes_neither_frozen_nor_trainable_weights(
    tmp_path, env, base, tokenizer
) -> None:
    cfg = _cfg(tmp_path, f"model.checkpoint={base}", *ZERO1_BF16)
    parts = _parts(cfg, tokenizer)
    Trainer(cfg, parts, env).fit()
    step4 = tmp_path / "run" / "checkpoints" / "step_000004"
    assert _tensors(step4 / "model.safetensors") == {}  # frozen: the base's; trainable: the masters'
    record = json.loads((step4 / "weights.json").read_text())
    frozen = {n for n, p in parts.model.named_parameters() if not p.requires_grad}
    trainable = {n for n, p in parts.model.named_parameters() if p.requires_grad}
    assert set(record["from_base"]) == frozen and set(record["from_optimizer"]["params"]) == trainable
    assert record["base"]["path"] == str(base.resolve())
    assert (
        record["base"]["files"]["model.safetensors"]["bytes"] == (base / "model.safetensors").stat().st_size
    )
    # the bf16 working copies are the masters rounded: the full model rebuilds bit for bit
    assert any(p.dtype == torch.bfloat16 for p in trainable_params(parts.model))
    rebuilt, report = load_pretrained(step4)
    assert report.missing == []
    live = parts.model.state_dict()
    assert all(torch.equal(t, live[k]) for k, t in rebuilt.state_dict().items())
    # a save held the whole model besides the optimizer state; now only small files are left beside it
    others = _bytes(step4) - (step4 / "optimizer.pt").stat().st_size
    assert others < 64_000 and (base / "model.safetensors").stat().st_size > 4_000_000


def trainable_params(model):
    return [p for p in model.parameters() if p.requires_grad]


@pytest.mark.parametrize("sets", [ZERO1_BF16, ("optimizations.comm=ddp",)], ids=["zero1-bf16", "ddp"])
def test_resume_from_a_small_checkpoint_is_bit_exact(tmp_path, env, base, tokenizer, sets) -> None:
    cfg = _cfg(tmp_path, f"model.checkpoint={base}", *sets)
    Trainer(cfg, _parts(cfg, tokenizer), env).fit()
    reference = _losses(tmp_path / "run")
    step2 = tmp_path / "run" / "checkpoints" / "step_000002"
    written = _tensors(step2 / "model.safetensors")
    if "optimizations.comm=ddp" in sets:  # no masters: the trainable weights are written, in fp32
        parts = _parts(cfg, tokenizer)
        assert set(written) == {n for n, p in parts.model.named_parameters() if p.requires_grad}
        assert {t.dtype for t in written.values()} == {torch.float32}
    resumed = _cfg(tmp_path, f"model.checkpoint={base}", *sets, f"checkpoint.resume={step2}")
    parts = _parts(resumed, tokenizer)
    with torch.no_grad():  # the resume must overwrite every trainable weight
        for p in trainable_params(parts.model):
            p.fill_(0.5)
    Trainer(resumed, parts, env).fit()
    assert _losses(tmp_path / "run") == reference


def test_a_run_from_random_weights_writes_its_frozen_weights(tmp_path, env, tokenizer) -> None:
    cfg = _cfg(tmp_path, *ZERO1_BF16)
    parts = _parts(cfg, tokenizer)
    Trainer(cfg, parts, env).fit()
    step4 = tmp_path / "run" / "checkpoints" / "step_000004"
    frozen = {n for n, p in parts.model.named_parameters() if not p.requires_grad}
    assert (
        set(_tensors(step4 / "model.safetensors")) == frozen
    )  # the seed alone would tie them to torch's RNG
    assert json.loads((step4 / "weights.json").read_text())["base"] is None
    rebuilt, report = load_pretrained(step4)
    live = parts.model.state_dict()
    assert report.missing == [] and all(torch.equal(t, live[k]) for k, t in rebuilt.state_dict().items())


@pytest.fixture
def finished(tmp_path, env, base, tokenizer) -> Path:
    """A finished run from a copy of the base; returns its step-2 checkpoint."""
    copy = tmp_path / "base"
    shutil.copytree(base, copy)
    cfg = _cfg(tmp_path, f"model.checkpoint={copy}", *ZERO1_BF16)
    Trainer(cfg, _parts(cfg, tokenizer), env).fit()
    return tmp_path / "run" / "checkpoints" / "step_000002"


def _resume(tmp_path, env, tokenizer, step2: Path, *sets: str) -> None:
    cfg = _cfg(tmp_path, *ZERO1_BF16, f"checkpoint.resume={step2}", *sets)
    parts = _parts(_cfg(tmp_path), tokenizer)  # claim_run refuses before these parts are used
    Trainer(cfg, parts, env).fit()


def test_a_changed_or_missing_base_is_refused(tmp_path, env, tokenizer, finished) -> None:
    copy = tmp_path / "base"
    with pytest.raises(ConfigError, match=f"model.checkpoint: is not set, but {finished} holds only what"):
        _resume(tmp_path, env, tokenizer, finished)
    weights = copy / "model.safetensors"
    data = bytearray(weights.read_bytes())
    data[-1] ^= 0xFF
    weights.write_bytes(bytes(data))
    with pytest.raises(ConfigError, match=r"model.safetensors differs from the base the checkpoint recorded"):
        _resume(tmp_path, env, tokenizer, finished, f"model.checkpoint={copy}")
    moved = tmp_path / "moved"
    copy.rename(moved)
    with pytest.raises(ConfigError, match=f"base {copy.resolve()} .* but {copy} does not exist"):
        _resume(tmp_path, env, tokenizer, finished, f"model.checkpoint={copy}")
    data[-1] ^= 0xFF
    (moved / "model.safetensors").write_bytes(bytes(data))  # restored, at another place: accepted
    _resume(tmp_path, env, tokenizer, finished, f"model.checkpoint={moved}")
    from gr00t_train.checkpoint.restore import BaseError

    shutil.rmtree(moved)
    with pytest.raises(BaseError, match=f"its base {copy.resolve()} .* does not exist. Restore that folder"):
        load_pretrained(finished)


def test_a_run_from_one_of_our_checkpoints_resolves_its_chain(tmp_path, env, base, tokenizer) -> None:
    first = _cfg(tmp_path / "a", f"model.checkpoint={base}", *ZERO1_BF16, "steps=2")
    Trainer(first, _parts(first, tokenizer), env).fit()
    start = tmp_path / "a" / "run" / "checkpoints" / "step_000002"  # partial: base + masters
    cfg = _cfg(tmp_path / "b", f"model.checkpoint={start}", *ZERO1_BF16)
    parts = _parts(cfg, tokenizer)
    started, _ = load_pretrained(start)
    assert all(torch.equal(t, started.state_dict()[k]) for k, t in parts.model.state_dict().items())
    Trainer(cfg, parts, env).fit()
    step4 = tmp_path / "b" / "run" / "checkpoints" / "step_000004"
    record = json.loads((step4 / "weights.json").read_text())
    assert record["base"]["path"] == str(start.resolve()) and "optimizer.pt" in record["base"]["files"]
    rebuilt, report = load_pretrained(step4)  # step 4 -> its base step 2 -> the base folder
    live = parts.model.state_dict()
    assert report.missing == [] and all(torch.equal(t, live[k]) for k, t in rebuilt.state_dict().items())
