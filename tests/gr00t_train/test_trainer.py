"""The training loop on CPU with a tiny stand-in model: learning, metrics, resume, failures."""

from __future__ import annotations

import json

import gr00t_train
import pytest
import torch
from gr00t_train import BatchTooLargeError, NonFiniteLossError, NonFiniteWeightsError, Trainer


def _losses(run_dir) -> list[float]:
    return [json.loads(line)["loss"] for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def test_loss_falls_and_metrics_are_written(tmp_path, env, standins) -> None:
    cfg = standins.small_config(tmp_path, steps=40, optim__lr="5e-2", logging__plots="true", logging__every=7)
    summary = Trainer(cfg, standins.make_parts(), env).fit()
    run = tmp_path / "run"
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == list(range(1, 41))
    for key in (
        "loss",
        "lr",
        "grad_norm",
        "samples_per_s",
        "tokens_per_s",
        "data_wait_s",
        "h2d_s",
        "compute_s",
        "comm_s",
        "optimizer_s",
        "step_time_s",
        "mfu",
    ):
        assert key in rows[0], key
    assert rows[0]["mfu"] is None  # no peak known for a CPU
    assert rows[3]["lr"] == pytest.approx(5e-2)  # warmup of 4 steps (10% of 40) reaches the peak at step 4
    assert rows[5]["tokens_per_s"] == pytest.approx(2.0 * rows[5]["samples_per_s"])
    assert summary.final_loss < 0.5 * summary.first_loss
    assert summary.measured_steps == 38 and summary.steps == 40
    assert {"data_wait", "compute", "optimizer", "other"} <= set(summary.breakdown_s)
    assert "samples/s" in summary.table()
    assert (run / "loss.png").stat().st_size > 1000 and (run / "step_time.png").stat().st_size > 1000
    written = json.loads((run / "summary.json").read_text())
    assert written["measured_steps"] == 38 and written["world_size"] == 1 and written["global_batch"] == 4
    assert json.loads((run / "config.json").read_text())["steps"] == 40
    final = run / "checkpoints" / "step_000040"
    assert (final / "model.safetensors").is_file() and (final / "train_config.json").is_file()


def test_peak_flops_give_mfu(tmp_path, env, standins) -> None:
    cfg = standins.small_config(
        tmp_path, steps=3, logging__peak_tflops="1e-6", checkpoint__save_final="false"
    )
    parts = standins.make_parts()
    Trainer(cfg, parts, env).fit()
    row = json.loads((tmp_path / "run" / "metrics.jsonl").read_text().splitlines()[-1])
    assert row["mfu"] == pytest.approx(row["samples_per_s"] * parts.flops_per_sample / 1e6)


def test_frozen_parameters_do_not_move(tmp_path, env, standins) -> None:
    parts = standins.make_parts()
    frozen_before = parts.model.frozen.weight.clone()
    trained_before = parts.model.net[0].weight.clone()
    Trainer(standins.small_config(tmp_path, steps=3), parts, env).fit()
    assert torch.equal(parts.model.frozen.weight, frozen_before)
    assert not torch.equal(parts.model.net[0].weight, trained_before)


def test_grad_accumulation_equals_one_large_batch(tmp_path, env, standins) -> None:
    # 2 microbatches of 4 must give the update of one batch of the same 8 samples (no noise, no dropout).
    def plain_mse(module, batch):
        return torch.nn.functional.mse_loss(module(batch["x"]), batch["y"])

    class Halves:
        """Serves the 8 samples of `big` either whole or as two halves."""

        def __init__(self, big, parts_per_step):
            self.big, self.parts_per_step, self.position = big, parts_per_step, 0

        def __next__(self):
            k = self.position % self.parts_per_step
            self.position += 1
            n = 8 // self.parts_per_step
            return {key: value[k * n : (k + 1) * n] for key, value in self.big.items()}

        def state_dict(self):
            return {"position": self.position}

        def load_state_dict(self, state):
            self.position = state["position"]

        def timings(self):
            return {}

        def close(self):
            pass

    big = next(standins.SyntheticSource(8))
    weights = []
    for accum, size in ((1, 8), (2, 4)):
        parts = standins.make_parts(batch_size=size)
        parts.model.eval()  # no dropout
        parts.loss_fn = plain_mse
        parts.data = Halves(big, accum)
        cfg = standins.small_config(
            tmp_path / str(accum), steps=2, data__batch_size=size, optim__grad_accum=accum
        )
        trainer = Trainer(cfg, parts, env)
        trainer.fit()
        assert trainer.global_batch == 8 and trainer.samples_seen == 16
        weights.append([p.detach().clone() for p in parts.model.parameters()])
    for a, b in zip(*weights):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize(("comm", "graph"), [("ddp", "eager"), ("zero1_overlap", "per_microbatch")])
def test_resume_is_bit_exact(tmp_path, env, standins, comm: str, graph: str) -> None:
    modes = {"optimizations__comm": comm, "optimizations__graph": graph}
    full = standins.small_config(tmp_path / "a", steps=12, **modes)
    Trainer(full, standins.make_parts(), env).fit()
    reference = _losses(tmp_path / "a" / "run")

    first = standins.small_config(tmp_path / "b", steps=12, checkpoint__every=5, **modes)
    trainer = Trainer(first, standins.make_parts(), env)
    original = trainer._save_due

    def die_at_step_7() -> bool:  # the job is killed after step 7, past the step-5 checkpoint
        if trainer.step == 7:
            raise KeyboardInterrupt
        return original()

    trainer._save_due = die_at_step_7
    with pytest.raises(KeyboardInterrupt):
        trainer.fit()
    assert (tmp_path / "b" / "run" / "checkpoints" / "step_000005").is_dir()

    resumed_cfg = gr00t_train.apply_overrides(first, ["checkpoint.resume=auto"])
    resumed = Trainer(resumed_cfg, standins.make_parts(seed=0), env)
    resumed.fit()
    assert resumed.parts.data.position == 12
    rows = [json.loads(line) for line in (tmp_path / "b" / "run" / "metrics.jsonl").read_text().splitlines()]
    # Steps 6 and 7 ran twice (before the kill and after the resume) but are logged once: the resumed run's.
    assert [row["step"] for row in rows] == list(range(1, 13))
    assert [row["loss"] for row in rows] == reference  # bit for bit
    # The final weights match too.
    final_a = (tmp_path / "a" / "run" / "checkpoints" / "step_000012" / "model.safetensors").read_bytes()
    final_b = (tmp_path / "b" / "run" / "checkpoints" / "step_000012" / "model.safetensors").read_bytes()
    assert final_a == final_b


def test_resume_without_random_state_would_diverge(tmp_path, env, standins) -> None:
    # Guards the test above: the stand-in's losses do depend on the restored random streams.
    cfg = standins.small_config(tmp_path, steps=6, checkpoint__every=3)
    Trainer(cfg, standins.make_parts(), env).fit()
    reference = _losses(tmp_path / "run")
    resumed = gr00t_train.apply_overrides(
        cfg, ["checkpoint.resume=" + str(tmp_path / "run/checkpoints/step_000003")]
    )
    trainer = Trainer(resumed, standins.make_parts(), env)
    import gr00t_train.checkpoint.component as loop

    real = loop.set_rng_state
    loop.set_rng_state = lambda state, device: None
    try:
        trainer.fit()
    finally:
        loop.set_rng_state = real
    assert _losses(tmp_path / "run")[-3:] != reference[-3:]


def test_keep_last_n(tmp_path, env, standins) -> None:
    cfg = standins.small_config(tmp_path, steps=10, checkpoint__every=2, checkpoint__keep_last=2)
    Trainer(cfg, standins.make_parts(), env).fit()
    names = sorted(p.name for p in (tmp_path / "run" / "checkpoints").iterdir())
    assert names == ["step_000008", "step_000010"]


def test_nan_loss_stops_with_step_and_episode_ids(tmp_path, env, standins) -> None:
    cfg = standins.small_config(tmp_path, steps=12, logging__every=4)
    parts = standins.make_parts(batch_size=4, nan_at=5)  # the 6th batch holds a NaN
    with pytest.raises(NonFiniteLossError) as info:
        Trainer(cfg, parts, env).fit()
    err = info.value
    assert err.step == 6 and err.episode_ids == [10, 10, 11, 11]
    assert "loss is nan at step 6" in str(err) and "episode ids [10, 10, 11, 11]" in str(err)
    # The sample that carries the NaN, not just the batch:
    assert err.bad_samples == "Sample 0 of microbatch 0 (episode 10, frame 0) has NaN/inf in x, y"
    assert str(err).endswith("has NaN/inf in x, y. Fix or drop those frames (`vla-io check` lists them).")
    assert parts.data.closed  # the pipeline is shut down on the way out
    assert not (tmp_path / "run" / "checkpoints").exists()  # nothing was saved from the broken state


def test_a_diverging_model_says_its_inputs_were_finite(tmp_path, env, standins) -> None:
    parts = standins.make_parts(batch_size=4)

    def blow_up(module, batch):
        return standins.noisy_mse(module, batch) * float("inf")

    parts.loss_fn = blow_up
    with pytest.raises(NonFiniteLossError, match="Every input of that batch is finite: the model diverged"):
        Trainer(standins.small_config(tmp_path, steps=3), parts, env).fit()


def test_no_checkpoint_is_written_from_non_finite_weights(tmp_path, env, standins) -> None:
    # The loss stays finite, but step 4's update makes the weights NaN (a NaN gradient of one parameter, as
    # an overflow in a rarely used layer gives, spreads through the global norm): the save of step 4 must
    # refuse, step 2's checkpoint stays the newest.
    parts = standins.make_parts()
    weight = parts.model.net[0].weight
    calls = {"n": 0}

    def poison(grad):
        calls["n"] += 1
        return grad * float("nan") if calls["n"] == 4 else grad

    weight.register_hook(poison)
    cfg = standins.small_config(tmp_path, steps=6, checkpoint__every=2, optim__grad_clip=0)
    with pytest.raises(NonFiniteWeightsError, match=r"weights hold NaN/inf after step 4 \(net\.0\.weight, "):
        Trainer(cfg, parts, env).fit()
    root = tmp_path / "run" / "checkpoints"
    assert sorted(p.name for p in root.iterdir()) == ["step_000002"]


def test_out_of_memory_names_the_batch_size(tmp_path, env, standins) -> None:
    parts = standins.make_parts(batch_size=4)
    calls = {"n": 0}

    def explode(module, batch):
        calls["n"] += 1
        if calls["n"] == 3:
            raise torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 20.00 GiB")
        return standins.noisy_mse(module, batch)

    parts.loss_fn = explode
    with pytest.raises(BatchTooLargeError) as info:
        Trainer(standins.small_config(tmp_path, steps=5), parts, env).fit()
    message = str(info.value)
    assert "at step 3 with data.batch_size=4 per device" in message
    assert "Tried to allocate 20.00 GiB" in message and "raise optim.grad_accum" in message


def _run_modes(tmp_path, env, standins, comm: str, graph: str, seed: int = 0, clip: float = 0.0):
    name = f"{comm}-{graph}-{seed}-{clip}"
    cfg = standins.small_config(
        tmp_path / name,
        steps=6,
        optim__grad_accum=2,
        optim__grad_clip=clip,
        optimizations__comm=comm,
        optimizations__graph=graph,
        optimizations__graph_warmup=2,
        checkpoint__save_final="false",
    )
    parts = standins.make_parts(seed=seed)
    trainer = Trainer(cfg, parts, env)
    trainer.fit()
    rows = [json.loads(line) for line in (tmp_path / name / "run" / "metrics.jsonl").read_text().splitlines()]
    return rows, [p.detach().clone() for p in parts.model.parameters()], trainer


SWITCHES = [
    ("allreduce_after_backward", "eager"),
    ("overlap", "eager"),
    ("zero1_overlap", "eager"),
    ("overlap", "per_microbatch"),
    ("zero1_overlap", "full_iteration"),
    ("allreduce_after_backward", "per_microbatch"),
]


@pytest.mark.parametrize(("comm", "graph"), SWITCHES)
def test_every_switch_follows_the_same_trajectory(tmp_path, env, standins, comm: str, graph: str) -> None:
    # On CPU graphs run emulated (same buffers, warmup and callbacks, eager kernels): everything the
    # trainer wires (no_sync, explicit sync, draws, zeroing) must leave the numbers unchanged, bit for bit,
    # for any data. Without clipping: with it, the norm is summed in another order (the test below).
    ref_rows, ref_params, _ = _run_modes(tmp_path, env, standins, "ddp", "eager")
    rows, params, trainer = _run_modes(tmp_path, env, standins, comm, graph)
    assert [r["loss"] for r in rows] == [r["loss"] for r in ref_rows]
    for a, b in zip(params, ref_params):
        assert torch.equal(a, b)
    report = trainer.graphed_step.report
    assert report.mode == graph and report.backend == ("eager" if graph == "eager" else "emulated")


@pytest.mark.parametrize("comm", ["allreduce_after_backward", "zero1_overlap"])
def test_clipped_switches_stay_within_the_summation_order_bound(tmp_path, env, standins, comm: str) -> None:
    # The all-reduce modes clip with torch's own clip and ZeRO-1 sums the per-parameter norms in torch's
    # order, so these runs are bitwise equal on the CPUs tried. Before, vla_overlap summed in bucket order
    # and the norm differed in its last bit on some data (seed 2 on AVX2, seed 0 with AVX-512 MKL kernels);
    # the bound stays what such a difference could cause: n squares summed in two orders are at most n
    # units of roundoff (u = 2**-24) apart in the norm, and Adam hardly sees a gradient scale that small, so
    # a weight ends at most about an ulp per step away: 6 steps x eps x the largest weight.
    ref_rows, ref_params, _ = _run_modes(tmp_path, env, standins, "ddp", "eager", seed=2, clip=1.0)
    rows, params, _ = _run_modes(tmp_path, env, standins, comm, "eager", seed=2, clip=1.0)
    assert any(r["grad_norm"] > 1.0 for r in ref_rows), "the clip must be active in some steps"
    n = len(params)
    eps = torch.finfo(torch.float32).eps
    for row, ref in zip(rows, ref_rows):
        assert row["grad_norm"] == pytest.approx(ref["grad_norm"], rel=n * 2**-24, abs=0)
        assert row["loss"] == pytest.approx(ref["loss"], rel=6 * eps, abs=0)
    for a, b in zip(params, ref_params):
        torch.testing.assert_close(a, b, rtol=0, atol=6 * eps * float(b.abs().max()))


def test_fit_restores_the_torch_switches_it_set(tmp_path, env, standins) -> None:
    # TF32 and cuDNN autotuning are process-wide: the run sets them, the caller gets its own back, also when
    # the run fails.
    matmul, cudnn = torch.backends.cuda.matmul, torch.backends.cudnn
    before = (matmul.allow_tf32, cudnn.allow_tf32, cudnn.benchmark)
    assert not matmul.allow_tf32 and not cudnn.benchmark  # torch's defaults: what the run turns on
    seen = []

    def loss(module, batch):
        seen.append((matmul.allow_tf32, cudnn.allow_tf32, cudnn.benchmark))
        if len(seen) == 5:
            raise RuntimeError("boom")
        return standins.noisy_mse(module, batch)

    on = {"optimizations__tf32": "true", "optimizations__cudnn_benchmark": "true"}
    parts = standins.make_parts()
    parts.loss_fn = loss
    trainer = Trainer(standins.small_config(tmp_path, steps=3, **on), parts, env)
    assert (matmul.allow_tf32, cudnn.benchmark) == (False, False)  # nothing set before fit()
    trainer.fit()
    assert seen == [(True, True, True)] * 3
    assert (matmul.allow_tf32, cudnn.allow_tf32, cudnn.benchmark) == before
    parts = standins.make_parts()
    parts.loss_fn = loss
    with pytest.raises(RuntimeError, match="boom"):
        Trainer(standins.small_config(tmp_path / "again", steps=3, **on), parts, env).fit()
    assert (matmul.allow_tf32, cudnn.allow_tf32, cudnn.benchmark) == before


def test_checkpoints_carry_no_zip_crc_and_their_manifest_still_catches_a_changed_byte(
    tmp_path, env, standins
) -> None:
    import zipfile

    from gr00t_train.checkpoint.checkpointer import verify_checkpoint

    Trainer(standins.small_config(tmp_path, steps=2, checkpoint__every=2), standins.make_parts(), env).fit()
    step = tmp_path / "run" / "checkpoints" / "step_000002"
    optimizer = step / "optimizer.pt"
    with zipfile.ZipFile(optimizer) as archive:
        records = [i for i in archive.infolist() if "/data/" in i.filename]
    assert records and all(i.CRC == 0 for i in records)  # not computed: the manifest's SHA-256 covers them
    state = torch.load(optimizer, weights_only=True)
    assert any(torch.is_tensor(v) for group in state["state"].values() for v in group.values())
    assert verify_checkpoint(step) is None
    data = bytearray(optimizer.read_bytes())
    data[len(data) // 2] ^= 0xFF
    optimizer.write_bytes(bytes(data))
    assert "optimizer.pt" in verify_checkpoint(step)


def test_tensorboard_scalars_when_installed(tmp_path, env, standins, monkeypatch) -> None:
    import sys
    import types

    written = []

    class FakeWriter:  # stands in for torch.utils.tensorboard.SummaryWriter (not installed here)
        def __init__(self, path):
            self.path = path

        def add_scalar(self, tag, value, step):
            written.append((tag, step, value))

        def close(self):
            written.append(("closed", None, None))

    module = types.ModuleType("torch.utils.tensorboard")
    module.SummaryWriter = FakeWriter
    monkeypatch.setitem(sys.modules, "torch.utils.tensorboard", module)
    Trainer(standins.small_config(tmp_path, steps=5, logging__every=3), standins.make_parts(), env).fit()
    rows = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    # a point per key and logging window (steps 1-3, then 4-5), at its last step: the window's mean, the last lr
    losses = {step: value for tag, step, value in written if tag == "train/loss"}
    assert losses == {
        3: pytest.approx(sum(r["loss"] for r in rows[:3]) / 3),
        5: pytest.approx(sum(r["loss"] for r in rows[3:]) / 2),
    }
    lrs = [(step, value) for tag, step, value in written if tag == "train/lr"]
    assert lrs == [(3, rows[2]["lr"]), (5, rows[4]["lr"])]
    assert ("train/samples_per_s", 5) in [(tag, step) for tag, step, _ in written]
    assert written[-1] == ("closed", None, None)


@pytest.mark.parametrize("steps,window", [(1, 1), (4, 2), (19, 9), (20, 10), (50, 10)])
def test_first_and_final_loss_are_halves_of_a_short_run(steps: int, window: int) -> None:
    # A 4-step run once printed "loss 1.3360 -> 1.3360": both means covered all 4 steps.
    from gr00t_train.metrics.records import Throughput, summarize

    throughput = Throughput(samples_per_step=2)
    records = [throughput.record(s, float(s), 1e-4, None, {"step": 0.1, "data_wait": 0.0, "h2d": 0.0,
               "compute": 0.1, "comm": 0.0, "optimizer": 0.0, "optimizer_overlapped": 0.0}) for s in range(1, steps + 1)]  # fmt: skip
    summary = summarize(records, 0, throughput)
    assert summary.first_loss == sum(range(1, window + 1)) / window
    assert summary.final_loss == sum(range(steps - window + 1, steps + 1)) / window
