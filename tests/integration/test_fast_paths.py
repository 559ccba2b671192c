"""The speed switches change speed, not numbers: the optimizer on its side stream (with the frozen prefix
computed ahead), bf16 working weights with fp32 master weights, and the update skipping untouched embodiment
rows follow the plain trajectory bitwise, on the tiny GR00T model under bf16 autocast (CPU; graphs emulated).
The GPU versions are in test_gpu.py."""

from __future__ import annotations

import pytest
import torch

BASE = ("steps=3", "precision=bf16", "optimizations.comm=zero1_overlap", "optimizations.graph=per_microbatch",
        "optim.grad_accum=2")  # fmt: skip


def _train(dataset, out, train_args, *sets: str, round_init: bool) -> tuple[list[float], dict]:
    import gr00t_train
    from gr00t_train.model.build import build_parts

    cfg = gr00t_train.load_config(preset="demo", overrides=train_args(dataset, out, *BASE, *sets)[4::2])
    env = gr00t_train.init_distributed("cpu")
    try:
        parts = build_parts(cfg, env)
        if round_init:
            # bf16 weights start from the bf16 rounding of the initial weights (as Megatron's do); give the
            # fp32 run the same starting values, so any later difference would come from the training path.
            with torch.no_grad():
                for p in parts.model.matmul_weights():
                    if p.requires_grad:
                        p.copy_(p.to(torch.bfloat16))
        trainer = gr00t_train.Trainer(cfg, parts, env)
        summary = trainer.fit()
        weights = {n: p.detach().clone() for n, p in parts.model.named_parameters()}
    finally:
        gr00t_train.shutdown_distributed(env)
    assert summary.steps == 3
    return [r.loss for r in trainer_records(out)], weights


def trainer_records(out):
    import json

    from gr00t_train.metrics.records import StepRecord

    return [StepRecord(**json.loads(line)) for line in (out / "metrics.jsonl").read_text().splitlines()]


@pytest.mark.slow
def test_optimizer_overlap_and_bf16_weights_follow_the_plain_trajectory(
    dataset, tmp_path, train_args
) -> None:
    runs = {
        "plain": (),
        "optimizer_overlap": ("optimizations.optimizer_overlap=true",),
        "bf16_weights": ("optimizations.optimizer_overlap=true", "optimizations.bf16_weights=true"),
    }
    results = {name: _train(dataset, tmp_path / name, train_args, *sets, round_init=True)
               for name, sets in runs.items()}  # fmt: skip
    plain_losses, plain_weights = results["plain"]
    for name in ("optimizer_overlap", "bf16_weights"):
        losses, weights = results[name]
        assert losses == plain_losses, name
        for key, value in plain_weights.items():
            # bf16_weights holds matmul weights as the bf16 rounding of its fp32 masters
            assert torch.equal(weights[key], value.to(weights[key].dtype)), (name, key)


@pytest.mark.slow
def test_skipping_untouched_embodiment_rows_follows_the_stepped_trajectory(
    dataset, tmp_path, train_args, monkeypatch
) -> None:
    """optimizations.skip_untouched_rows with the flat step (its torch arithmetic: the Triton kernel needs
    CUDA) and grouped embodiment GEMMs: the demo dataset uses one embodiment slot, the update skips the other
    31 slots' table rows, and every loss and weight equals the run that steps them, bitwise (what is skipped
    would have added zeros)."""
    import gr00t_train
    from gr00t_train import _comm
    from gr00t_train.model.build import build_parts

    monkeypatch.setattr(_comm, "_flat_kernel", lambda opts, env: "torch")
    sets = ("optimizations.bf16_weights=true", "optimizations.grouped_embodiment_gemms=on")
    results = {}
    for flag in ("true", "false"):
        out = tmp_path / flag
        overrides = train_args(dataset, out, *BASE, *sets, f"optimizations.skip_untouched_rows={flag}")[4::2]
        cfg = gr00t_train.load_config(preset="demo", overrides=overrides)
        env = gr00t_train.init_distributed("cpu")
        try:
            parts = build_parts(cfg, env)
            table = parts.model.action_head.action_encoder.W2.W
            before = table.detach().clone()
            trainer = gr00t_train.Trainer(cfg, parts, env)
            trainer.fit()
            weights = {n: p.detach().clone() for n, p in parts.model.named_parameters()}
        finally:
            gr00t_train.shutdown_distributed(env)
        touched = trainer.model.rows_touched
        results[flag] = ([r.loss for r in trainer_records(out)], weights, touched, before)
    losses, weights, touched, before = results["true"]
    assert touched is not None and results["false"][2] is None
    assert int(touched.sum()) == 1  # one embodiment
    assert torch.equal(weights["action_head.action_encoder.W2.W"][~touched], before[~touched])
    assert losses == results["false"][0]
    assert all(torch.equal(value, results["false"][1][name]) for name, value in weights.items())


@pytest.mark.slow
def test_merged_dit_linears_train_as_the_release_form_and_save_its_names(
    dataset, tmp_path, train_args, monkeypatch
) -> None:
    """optimizations.merged_dit_linears with bf16 weights and the flat step (its torch arithmetic), from the
    same seed (a merged Linear takes its parts' initial values): the same losses to bf16 rounding (each merged
    input gradient sums its parts inside one GEMM, a reassociation), and the trained weights under the
    release's names."""
    import gr00t_train
    from gr00t_train import _comm
    from gr00t_train.model.build import build_parts

    monkeypatch.setattr(_comm, "_flat_kernel", lambda opts, env: "torch")
    results = {}
    for flag in ("off", "on"):
        out = tmp_path / flag
        sets = (*BASE, "optimizations.bf16_weights=true", f"optimizations.merged_dit_linears={flag}")
        cfg = gr00t_train.load_config(preset="demo", overrides=train_args(dataset, out, *sets)[4::2])
        env = gr00t_train.init_distributed("cpu")
        try:
            parts = build_parts(cfg, env)
            assert hasattr(parts.model.action_head.model, "modulations") == (flag == "on")
            gr00t_train.Trainer(cfg, parts, env).fit()
            state = {k: v.detach().float().clone() for k, v in parts.model.state_dict().items()}
        finally:
            gr00t_train.shutdown_distributed(env)
        results[flag] = ([r.loss for r in trainer_records(out)], state)
    (merged_losses, merged), (plain_losses, plain) = results["on"], results["off"]
    assert set(merged) == set(plain)
    torch.testing.assert_close(merged_losses, plain_losses, rtol=1e-2, atol=0)
    # An early Adam step moves a weight by about lr whatever its gradient's size, so where a near-zero gradient
    # changes sign between the runs the weights part by up to 2 lr per step: 6 lr after three steps.
    bound = 6 * 3e-3  # the demo preset's lr
    for key in plain:
        torch.testing.assert_close(merged[key], plain[key], rtol=0, atol=bound, msg=key)
    moved = torch.cat([(merged[k] - plain[k]).abs().flatten() for k in plain])
    assert moved.mean() < 0.01 * 3e-3, moved.mean()  # such sign changes stay rare (measured: 0.003 lr)


def test_a_checkpoint_resumes_only_in_its_own_form_and_says_so_before_building(
    dataset, tmp_path, train_args, capsys
) -> None:
    """The merged DiT linears change the parameters the optimizer state holds: resuming a checkpoint of the
    other form stops at the start (exit 2) naming the switch and the value that resumes it."""
    from gr00t_train.cli import main

    out = tmp_path / "run"
    sets = ("steps=4", "checkpoint.every=2", "precision=bf16")
    assert main(train_args(dataset, out, *sets, "optimizations.merged_dit_linears=off")) == 0
    capsys.readouterr()
    step2 = ["--resume", str(out / "checkpoints" / "step_000002")]
    argv = train_args(dataset, out, *sets, "optimizations.merged_dit_linears=on")
    assert main([*argv, *step2]) == 2
    err = capsys.readouterr().err
    assert "optimizations.merged_dit_linears: " in err and "written with the DiT's linears unmerged" in err
    assert "Resume with --set optimizations.merged_dit_linears=off" in err
    assert len(trainer_records(out)) == 4  # nothing trained
    assert main([*train_args(dataset, out, *sets), *step2]) == 0  # auto: off on a CPU
