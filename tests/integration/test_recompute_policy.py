"""memory.recompute_policy through the trainer: selective recompute trains the same losses, bit for bit, as
keeping every activation (CPU, fp32), and the resolved config records the policy."""

from __future__ import annotations

import json

from gr00t_train.cli import main


def test_selective_recompute_trains_the_same_losses(dataset, tmp_path, train_args, losses) -> None:
    assert main(train_args(dataset, tmp_path / "kept", "steps=3")) == 0
    selective = ("steps=3", "memory.recompute=dit,llm", "memory.recompute_policy=selective")
    assert main(train_args(dataset, tmp_path / "selective", *selective)) == 0
    assert losses(tmp_path / "selective") == losses(tmp_path / "kept")
    resolved = json.loads((tmp_path / "selective" / "config.json").read_text())
    assert resolved["memory"]["recompute_policy"] == "selective"
