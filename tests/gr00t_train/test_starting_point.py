"""Where a run starts, said out loud: random weights or the test tokenizer on a large preset warn at start
(and land in summary.json's facts); `train --help` names the settings to set first; `gr00t-train config`
documents every setting it prints."""

from __future__ import annotations

import json
import logging

import pytest
import yaml
from gr00t_train import TrainConfig, load_config
from gr00t_train.cli import build_parser, main
from gr00t_train.config.docs import field_docs
from gr00t_train.config.io import config_from_dict
from gr00t_train.model.gr00t import start_facts, tokenizer_path


def test_a_large_preset_from_random_weights_and_the_test_tokenizer_warns(caplog) -> None:
    with caplog.at_level(logging.WARNING, logger="gr00t_train"):
        facts = start_facts(load_config(overrides=["model.preset=n1.6-3b"]))
    assert facts["initial_weights"] == "random" and facts["tokenizer"].startswith("bundled byte-level")
    assert len(facts["warnings"]) == 2
    assert "n1.6-3b trains from random weights" in facts["warnings"][0]
    assert "--set model.checkpoint=DIR" in facts["warnings"][0]
    assert "bundled byte-level tokenizer" in facts["warnings"][1]
    assert all(line in caplog.text for line in facts["warnings"])


def test_the_tiny_preset_and_a_release_folder_do_not_warn(tmp_path) -> None:
    assert start_facts(load_config(overrides=["model.preset=tiny"]))["warnings"] == []
    sets = [f"model.checkpoint={tmp_path}", f"model.tokenizer={tmp_path / 'tok'}"]
    facts = start_facts(load_config(overrides=sets))
    assert facts == {"initial_weights": str(tmp_path), "tokenizer": str(tmp_path / "tok"), "warnings": []}


def test_our_checkpoint_brings_its_runs_tokenizer(tmp_path) -> None:
    checkpoint = tmp_path / "step_000010"
    checkpoint.mkdir()
    (checkpoint / "train_config.json").write_text(json.dumps({"model": {"tokenizer": "/models/qwen"}}))
    assert tokenizer_path(load_config(overrides=[f"model.checkpoint={checkpoint}"])) == "/models/qwen"
    named = load_config(overrides=[f"model.checkpoint={checkpoint}", "model.tokenizer=/other"])
    assert tokenizer_path(named) == "/other"  # a tokenizer given wins
    assert tokenizer_path(load_config(overrides=[f"model.checkpoint={tmp_path}"])) is None  # a release folder


def test_train_help_names_the_settings_to_set_first() -> None:
    text = build_parser()._subparsers._group_actions[0].choices["train"].format_help()
    for name in ("data.dataset", "data.cameras", "data.embodiment_tag", "model.checkpoint", "model.tokenizer",
                 "steps", "--resume-changed", "modality.json"):  # fmt: skip
        assert name in text, name


def test_config_prints_every_setting_under_its_doc(capsys) -> None:
    assert main(["config", "--preset", "libero"]) == 0
    text = capsys.readouterr().out
    lines = text.splitlines()
    settings = [i for i, line in enumerate(lines) if line.strip() and not line.lstrip().startswith("#")]
    for i in settings:
        if not lines[i].rstrip().endswith(":"):  # a setting, not a section header
            assert lines[i - 1].lstrip().startswith("#"), f"no comment above {lines[i]!r}"
    assert "# Episodes held out of training for validation" in text
    again = config_from_dict(TrainConfig, yaml.safe_load(text))
    assert again == load_config(preset="libero")  # the commented template reads back as it was


@pytest.mark.parametrize("section", ["DataConfig", "ModelConfig", "OptimConfig", "EvalConfig"])
def test_every_field_has_a_doc(section) -> None:
    import dataclasses

    import gr00t_train.config.sections as config

    cls = getattr(config, section)
    assert set(field_docs(cls)) == {f.name for f in dataclasses.fields(cls)}
