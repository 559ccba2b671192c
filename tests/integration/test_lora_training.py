"""LoRA fine-tuning through `gr00t-train train` (model.lora): what trains, resume, export merged or alone."""

from __future__ import annotations

import json

import gr00t_model
import pytest
import torch
from gr00t_train.cli import main

LORA = ("model.lora.rank=4", "checkpoint.every=3")


def test_only_the_adapters_and_the_projectors_train(dataset, tmp_path, train_args, losses, caplog) -> None:
    import gr00t_train
    from gr00t_train.model.gr00t import build_model

    cfg = gr00t_train.load_config(preset="demo", overrides=["model.lora.rank=4", "device=cpu"])
    model = build_model(cfg, torch.device("cpu"), gr00t_model.load_tokenizer(None))
    trained = [name for name, p in model.named_parameters() if p.requires_grad]
    projectors = ("action_head.state_encoder.", "action_head.action_encoder.", "action_head.action_decoder.")
    assert any(name.endswith(".lora_A") for name in trained)
    assert all(name.endswith((".lora_A", ".lora_B")) or name.startswith(projectors) for name in trained)

    out, full = tmp_path / "run", tmp_path / "full"
    with caplog.at_level("INFO", logger="gr00t_train"):
        assert main(train_args(dataset, out, *LORA)) == 0
    assert "LoRA: rank 4 adapters on" in caplog.text
    assert main(train_args(dataset, full, "checkpoint.every=3")) == 0
    size = lambda run: (run / "checkpoints" / "step_000006" / "optimizer.pt").stat().st_size  # noqa: E731
    assert size(out) < size(full)  # moments of the adapters and projectors only

    reference = losses(out)  # resume from step 3: steps 4-6 again, bit for bit
    args = train_args(dataset, out, *LORA)
    assert main([*args, "--resume", str(out / "checkpoints" / "step_000003")]) == 0
    assert losses(out) == reference


@pytest.mark.parametrize("comm", ["overlap", "zero1_overlap"])
def test_export_merges_the_adapters_or_writes_them_alone(dataset, tmp_path, train_args, comm) -> None:
    out = tmp_path / "run"
    sets = [*LORA, f"optimizations.comm={comm}"] + (
        ["optimizations.bf16_weights=on"] if comm == "zero1_overlap" else []
    )
    assert main(train_args(dataset, out, *sets)) == 0
    final = out / "checkpoints" / "step_000006"
    assert main(["export", str(final), str(tmp_path / "merged")]) == 0
    assert main(["export", str(final), str(tmp_path / "adapters"), "--lora-only"]) == 0

    from gr00t_train.checkpoint.restore import load_pretrained

    adapted, _ = load_pretrained(final)  # the trained model, adapters on
    merged = gr00t_model.from_pretrained(tmp_path / "merged", strict=True)
    assert getattr(merged, "lora_config", None) is None  # a plain model: the adapters are in its weights
    assert json.loads((tmp_path / "adapters" / "adapter_config.json").read_text())["rank"] == 4
    adapter_bytes = sum(p.stat().st_size for p in (tmp_path / "adapters").glob("adapter*"))
    model_bytes = sum(p.stat().st_size for p in (tmp_path / "merged").glob("*.safetensors"))
    assert adapter_bytes < model_bytes / 10

    batch = gr00t_model.make_dummy_batch(merged.config, batch_size=2, num_images=2, seed=1)
    noise = torch.randn(
        2,
        merged.config.action_horizon,
        merged.config.max_action_dim,
        generator=torch.Generator().manual_seed(0),
    )
    with torch.no_grad():
        a = adapted.eval().get_action(batch, noise=noise)
        b = merged.eval().get_action(batch, noise=noise)
    # x (W + s B A)^T against x W^T + s (x A^T) B^T: the merged weight is rounded to the weight's dtype (bf16
    # with bf16_weights: 2^-8 relative), and the products are summed in another order
    torch.testing.assert_close(a.float(), b.float(), rtol=1e-3, atol=1e-3)


def test_what_lora_cannot_run_with_is_refused(dataset, tmp_path, train_args, capsys) -> None:
    out = tmp_path / "run"
    assert main(train_args(dataset, out, *LORA, "optimizations.merged_dit_linears=on")) == 2
    assert "optimizations.merged_dit_linears: cannot be on with LoRA adapters" in capsys.readouterr().err
    assert main(train_args(dataset, out, *LORA, "model.lora.train_in_full=action_head.nothing")) == 2
    assert "model.lora.train_in_full: the model has no module action_head.nothing" in capsys.readouterr().err

    assert main(train_args(dataset, out, *LORA, "steps=3")) == 0
    capsys.readouterr()
    again = train_args(
        dataset, tmp_path / "again", *LORA, f"model.checkpoint={out / 'checkpoints' / 'step_000003'}"
    )
    assert main(again) == 2
    assert "holds LoRA adapters: `gr00t-train export` it" in capsys.readouterr().err


def test_recomputed_activations_train_the_same_losses(dataset, tmp_path, train_args, losses) -> None:
    """memory.recompute (activation checkpointing) is exact: the same losses, bit for bit, on a CPU."""
    assert main(train_args(dataset, tmp_path / "kept", "steps=4")) == 0
    assert main(train_args(dataset, tmp_path / "recomputed", "steps=4", "memory.recompute=dit,llm")) == 0
    assert losses(tmp_path / "recomputed") == losses(tmp_path / "kept")
