"""The trainer on a GPU (run on the H200): real CUDA graphs, NCCL, the async pipeline's copy stream."""

from __future__ import annotations

import math

import pytest

pytestmark = pytest.mark.gpu


def _run(dataset, tmp_path, train_args, *sets, dropout: bool = True, before_fit=None):
    """Train the demo preset on the GPU with `sets`; `before_fit(parts)` sees the parts before training."""
    import gr00t_train
    from gr00t_train.model.build import build_parts

    cfg = gr00t_train.load_config(
        preset="demo", overrides=[*train_args(dataset, tmp_path, *sets)[4::2], "device=cuda"]
    )
    env = gr00t_train.init_distributed("cuda")
    try:
        parts = build_parts(cfg, env)
        if not dropout:
            parts.model.action_head.model.eval()  # the DiT's dropout is its only train-mode behaviour
        if before_fit is not None:
            before_fit(parts)
        trainer = gr00t_train.Trainer(cfg, parts, env)
        summary = trainer.fit()
    finally:
        gr00t_train.shutdown_distributed(env)
    return trainer, summary


@pytest.mark.parametrize(
    ("comm", "graph"),
    [
        ("overlap", "per_microbatch"),
        ("zero1_overlap", "full_iteration"),
        ("allreduce_after_backward", "eager"),
    ],
)
def test_every_mode_trains_on_the_gpu(dataset, tmp_path, train_args, losses, comm, graph) -> None:
    sets = ("steps=8", f"optimizations.comm={comm}", f"optimizations.graph={graph}", "optim.grad_accum=2",
            "data.augment=true", "precision=bf16")  # fmt: skip
    trainer, summary = _run(dataset, tmp_path, train_args, *sets)
    report = trainer.graphed_step.report
    if graph == "eager":
        assert report.backend == "eager"
    else:
        assert report.backend == "cuda_graph" and report.replays >= 1 and not report.fallbacks
    values = losses(tmp_path)
    assert sorted(values) == list(range(1, 9)) and all(math.isfinite(v) for v in values.values())
    assert summary.samples_per_s > 0


def test_gpu_bench_ladder_runs(dataset, tmp_path) -> None:
    import gr00t_train
    from gr00t_train._bench import LADDER, format_table, run_ladder

    base = gr00t_train.load_config(
        preset="libero",
        overrides=[f"data.dataset={dataset}", "model.preset=tiny", "data.batch_size=4",
                   "data.num_workers=1", f"output_dir={tmp_path}", "logging.progress=false"],
    )  # fmt: skip
    result = run_ladder(base, steps=3, warmup=4)
    assert result["rows"][0]["row"].startswith("baseline") and len(result["rows"]) == len(LADDER)
    assert result["rows"][4]["graph_backend"] == "cuda_graph" and "kernel_families_ms" in result["rows"][-1]
    assert all(r["mfu"] is None or r["mfu"] > 0 for r in result["rows"])
    assert "speedup" in format_table(result)


@pytest.mark.parametrize(
    "graph,flat", [("per_microbatch", False), ("full_iteration", False), ("per_microbatch", True)]
)
def test_the_full_stack_trains_and_follows_eager(dataset, tmp_path, train_args, losses, graph, flat) -> None:
    """Compiled blocks in CUDA graphs, bf16 weights with fp32 masters, the optimizer on its side stream (torch's
    fused AdamW, or the one-pass flat kernel): the losses follow the plain eager run (dropout off, same batches
    and draws) within the drift of bf16 kernels that differ (inductor fuses and reorders): 2% after 10 steps;
    measured values in BENCHMARKS.md."""
    common = ("steps=10", "precision=bf16", "optim.grad_accum=2", "data.augment=false", "data.shuffle=false")
    fast = (f"optimizations.graph={graph}", "optimizations.compile=on", "optimizations.comm=zero1_overlap",
            "optimizations.bf16_weights=true", "optimizations.optimizer_overlap=true",
            f"optimizations.flat_optimizer={'on' if flat else 'off'}")  # fmt: skip
    plain = ("optimizations.graph=eager", "optimizations.compile=off", "optimizations.comm=overlap")
    runs = {}
    for name, sets in (("plain", plain), ("fast", fast)):
        trainer, _ = _run(dataset, tmp_path / name, train_args, *common, *sets, dropout=False)
        runs[name] = losses(tmp_path / name)
        if name == "fast":
            assert trainer.compiled_blocks > 0 and trainer.updates is not None
            assert (
                trainer.graphed_step.report.backend == "cuda_graph"
                and not trainer.graphed_step.report.fallbacks
            )
    for step, value in runs["plain"].items():
        assert math.isfinite(runs["fast"][step])
        assert abs(runs["fast"][step] - value) <= 0.02 * abs(value), (step, runs["fast"][step], value)


def test_bf16_gradient_buffers_follow_fp32_ones(dataset, tmp_path, train_args, losses, monkeypatch) -> None:
    """One microbatch on one rank with the flat step: the gradient buffers stay bf16 and the step reads them in
    place. Against the same run with fp32 buffers: every buffered value is the same bf16 gradient, so only
    the clipping norm's summation order differs (its kernel lays out bf16 and fp32 loads differently), an
    fp32 rounding of the coefficient; over 8 steps the losses stay within 1e-3 relative."""
    import torch
    from gr00t_train import _comm

    sets = ("steps=8", "precision=bf16", "optim.grad_accum=1", "data.augment=false", "data.shuffle=false",
            "optimizations.graph=per_microbatch", "optimizations.comm=zero1_overlap",
            "optimizations.bf16_weights=true", "optimizations.optimizer_overlap=true",
            "optimizations.flat_optimizer=on")  # fmt: skip
    runs, dtypes = {}, {}
    for name in ("bf16", "fp32"):
        if name == "fp32":
            monkeypatch.setattr(_comm, "_grad_buffer_dtype", lambda cfg, env: torch.float32)
        trainer, _ = _run(dataset, tmp_path / name, train_args, *sets, dropout=False)
        runs[name] = losses(tmp_path / name)
        dtypes[name] = {d.dtype for d in trainer.comm.module._grads.data}
    assert torch.bfloat16 in dtypes["bf16"] and dtypes["fp32"] == {torch.float32}
    for step, value in runs["fp32"].items():
        assert abs(runs["bf16"][step] - value) <= 1e-3 * abs(value), (step, runs["bf16"][step], value)


# bf16 gradient buffers read in place by the flat step: one microbatch, bf16 weights, the optimizer overlapped
_FLAT_STEP_ONE_GPU = ("steps=8", "precision=bf16", "optim.grad_accum=1", "data.augment=false", "data.shuffle=false",
                      "optimizations.graph=per_microbatch", "optimizations.comm=zero1_overlap",
                      "optimizations.bf16_weights=true", "optimizations.optimizer_overlap=true",
                      "optimizations.flat_optimizer=on")  # fmt: skip


def test_weight_gradients_written_by_their_gemms_train_as_copied_ones(
    dataset, tmp_path, train_args, losses
) -> None:
    """optimizations.weight_grads_in_place, compiled blocks in per-microbatch graphs: the weight-gradient GEMMs
    write the bf16 buffers. Against the hooks copying autograd's gradients in, the GEMMs are the same cuBLAS
    calls; only Inductor's fusion of the bias-gradient sums around them may differ (a bf16 rounding), so the
    losses of 8 steps must agree within 1e-3 relative, and the layers must really be routed."""
    sets = (*_FLAT_STEP_ONE_GPU, "optimizations.compile=on")
    runs, routed = {}, {}
    for flag in ("true", "false"):
        trainer, _ = _run(dataset, tmp_path / flag, train_args, *sets,
                          f"optimizations.weight_grads_in_place={flag}", dropout=False)  # fmt: skip
        runs[flag] = losses(tmp_path / flag)
        routed[flag] = len(trainer.comm.module._in_place)
    assert routed["true"] > 20 and routed["false"] == 0
    for step, value in runs["false"].items():
        assert abs(runs["true"][step] - value) <= 1e-3 * abs(value), (step, runs["true"][step], value)


def test_untouched_embodiment_rows_skipped_by_the_update_train_as_stepped_ones(
    dataset, tmp_path, train_args, losses
) -> None:
    """optimizations.skip_untouched_rows with the flat step: the demo dataset uses one embodiment, so the other
    slots of every per-embodiment table never get a gradient, and the update skips them. AdamW would move them
    by weight decay alone, which the demo preset does not use (at the defaults, lr 1e-4 and weight decay 1e-5,
    the factor rounds to 1 in fp32 too): those rows must stay bitwise at their initial values in both runs,
    and the losses of 8 steps agree (the same kernels elsewhere; 1e-3 relative leaves room for run-to-run
    differences of the attention backward)."""
    import torch

    sets = (*_FLAT_STEP_ONE_GPU, "optimizations.compile=off")
    runs, tables = {}, {}
    for flag in ("true", "false"):
        initial = {}

        def keep_initial(parts, initial=initial) -> None:
            initial["W"] = parts.model.action_head.action_encoder.W2.W.detach().clone()

        trainer, _ = _run(dataset, tmp_path / flag, train_args, *sets, f"optimizations.skip_untouched_rows={flag}",
                          dropout=False, before_fit=keep_initial)  # fmt: skip
        runs[flag] = losses(tmp_path / flag)
        after = trainer.parts.model.action_head.action_encoder.W2.W.detach()
        tables[flag] = (initial["W"], after, trainer.model.rows_touched)
    touched = tables["true"][2]
    assert touched is not None and tables["false"][2] is None
    assert 1 <= int(touched.sum()) < len(touched)
    for flag, (before, after, _) in tables.items():
        assert torch.equal(after[~touched], before[~touched]), flag  # untouched slots: unchanged
        assert not torch.equal(after[touched], before[touched]), flag  # the used slot trained
    for step, value in runs["false"].items():
        assert abs(runs["true"][step] - value) <= 1e-3 * abs(value), (step, runs["true"][step], value)


def test_the_update_in_stages_trains_as_in_one_pass(dataset, tmp_path, train_args, losses) -> None:
    """optimizations.staged_update: each trainable block waits for its own stage of the update instead of the
    whole update; the same kernel steps the same blocks, so the losses of 8 steps agree (1e-3 relative leaves
    room for run-to-run differences of the attention backward), and the trainer staged every trainable block."""
    sets = (*_FLAT_STEP_ONE_GPU, "optimizations.compile=off")
    runs, hooks = {}, {}
    for flag in ("true", "false"):
        trainer, _ = _run(dataset, tmp_path / flag, train_args, *sets, f"optimizations.staged_update={flag}",
                          dropout=False)  # fmt: skip
        runs[flag] = losses(tmp_path / flag)
        hooks[flag] = trainer.model.updates._stages
    model = trainer.parts.model
    trainable = [m for m in model.repeated_blocks() if any(p.requires_grad for p in m.parameters())]
    assert len(hooks["true"]) == len(trainable) + 1 and hooks["false"] == []
    for step, value in runs["false"].items():
        assert abs(runs["true"][step] - value) <= 1e-3 * abs(value), (step, runs["true"][step], value)
