"""The training step on a fixed batch (no data pipeline): our stack's variants, run through the trainer's
own components, side by side with what torch gives for free, in one process.

Rows (n1.6-3b, random weights, batch 16, two 252x252 cameras, bf16 autocast, TF32 on):
  free-eager            eager forward+backward + fused AdamW (fp32 trainable weights)
  free-reduce-overhead  torch.compile(model, mode="reduce-overhead") + fused AdamW
  ours-*                gr00t_train.Trainer on the fixed batch: per-microbatch CUDA graphs with the gradient
                        sync inside, per-block compiled kernels (compile), bf16 working weights with fp32 masters
                        (bf16w), the optimizer on a side stream under the next step's frozen forward (overlap,
                        with torch's fused AdamW in ours-full-fused-adamw, DistributedAdamW's one-pass Triton
                        step in ours-full)
Each row reports samples/s (whole optimizer steps), MFU against the datasheet peak, start-up (first step:
compile + capture), peak memory and the loss after the measured steps. The `parity` row trains the full
stack and eager for N steps with dropout off on identical batches and reports the largest relative loss
difference. The `profile` row gives the GPU kernel time by family of the full stack's step (`profile=ROW` of
another row; `--trace` keeps the timeline), `profile-ops` the GPU time per torch op and input shapes of the
same step run without graphs. `ours-full-piece-norm`, `-high-priority`, `-unaligned`, `-torch-norm`,
`-fp32-grads`, `-separate-gelu`, `-separate-qkv`, `-sdpa-self-attention`, `-inductor-dropout`, `-bernoulli-masks`, `-qwen3-adds-apart`, `-capture-default-priority`, `-cast-context-per-block`, `-eager-glue`, `-block-norm`, `-per-layer-sorts`, `-isfinite-tags`, `-dit-unsplit-reductions`, `-autotune-dit`, `-coordinate-descent`, `-cd-vision`, `-cd-backbone`, `-looped-reductions` and
`-max-autotune` are measured variants of `ours-full` (_step_patches.py).
`ours-serial` runs the flat update on the compute stream. `ours-full-grad-copies` copies the weight gradients into the buffers in hooks instead of having the
GEMMs write them; `ours-full-gathered-embodiments` gathers each sample's per-embodiment matrices instead of the
grouped GEMMs. `ours-full-one-embodiment` puts every sample in one embodiment slot (the update then skips the
other slots' table rows), `-stepped` without that skip. `ours-full-fp8` adds FP8 GEMMs for the frozen prefix (optimizations.fp8_frozen);
`ours-full-fp32-masters` steps fp32 masters instead of bf16 weight + remainder (optimizations.param_remainders);
`ours-full-sdpa-attention` runs the DiT's attention on SDPA instead of our Triton kernels;
`ours-full-unstaged-update` waits for the whole update before the first trainable block (optimizations.staged_update);
`ours-full-unmerged-dit-linears` runs the DiT's AdaLN and self-attention q/k/v projections one GEMM per Linear;
`parity=ROW` compares another row with eager. `update-alone` times the update's passes on a trained
`ours-serial` trainer's own buffers and on fresh ones.

    PYTHONPATH=$(ls -d $PWD/packages/*/src | tr '\\n' ':') python benchmarks/step_variants.py \\
        --json benchmarks/results/step_variants_h200.json
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import json
import time
import traceback
from pathlib import Path

import torch
from _cuda_timing import cuda_ms
from _step_patches import BUILT_WITH, PATCHES

_BF16W = ["optimizations.compile=on", "optimizations.comm=zero1_overlap", "optimizations.bf16_weights=true"]
ROWS = {
    "ours-graphs": [],
    "ours-graphs-compile": ["optimizations.compile=on"],
    "ours-graphs-compile-bf16w": [*_BF16W, "optimizations.flat_optimizer=off"],
    "ours-full-fused-adamw": [
        *_BF16W,
        "optimizations.optimizer_overlap=true",
        "optimizations.flat_optimizer=off",
    ],
    "ours-full": [*_BF16W, "optimizations.optimizer_overlap=true", "optimizations.flat_optimizer=auto"],
}
ROWS["ours-serial"] = [*_BF16W, "optimizations.flat_optimizer=auto"]  # the flat update on the compute stream
ROWS["ours-full-fp8"] = [*ROWS["ours-full"], "optimizations.fp8_frozen=true"]
# weight gradients into new tensors that the hooks copy into the buffers (before 2026-12-01)
ROWS["ours-full-grad-copies"] = [*ROWS["ours-full"], "optimizations.weight_grads_in_place=false"]
# the release's per-sample gather and bmm for the per-embodiment projections (before 2026-12-02)
ROWS["ours-full-gathered-embodiments"] = [*ROWS["ours-full"], "optimizations.grouped_embodiment_gemms=off"]
# every sample of the fixed batch in one embodiment slot, with and without the update skipping the other slots
ROWS["ours-full-one-embodiment"] = ROWS["ours-full"]
ROWS["ours-full-one-embodiment-stepped"] = [*ROWS["ours-full"], "optimizations.skip_untouched_rows=false"]
# fp32 masters stepped as they are, not as bf16 weight + 16-bit remainder (28 instead of 26 bytes per parameter)
ROWS["ours-full-fp32-masters"] = [*ROWS["ours-full"], "optimizations.param_remainders=false"]
# the DiT's attention on SDPA (cuDNN for cross, memory-efficient for self) instead of our Triton kernels
ROWS["ours-full-sdpa-attention"] = [*ROWS["ours-full"], "optimizations.triton_attention=off"]
# the whole update before the first trainable block (the earlier form), not one stage per block
ROWS["ours-full-unstaged-update"] = [*ROWS["ours-full"], "optimizations.staged_update=false"]
# the DiT's AdaLN projections and self-attention q/k/v as one GEMM per Linear (the earlier form)
ROWS["ours-full-unmerged-dit-linears"] = [*ROWS["ours-full"], "optimizations.merged_dit_linears=off"]
for _variant in (*PATCHES, *BUILT_WITH):  # measured variants of the full row (_step_patches.py)
    ROWS[_variant] = ROWS["ours-full"]

FREE = ("free-eager", "free-reduce-overhead")


def parse() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rows", default=",".join([*FREE, *ROWS, "parity", "profile"]),
                   help="comma-separated rows, in order; `parity` and `profile` are rows too")  # fmt: skip
    p.add_argument("--preset", default="n1.6-3b")
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--steps", type=int, default=30, help="measured steps per row")
    p.add_argument("--warmup", type=int, default=5, help="steps before measuring")
    p.add_argument("--parity", type=int, default=200, help="steps of the parity row (full stack vs eager)")
    p.add_argument("--device", default="cuda", help="cuda, or cpu for a smoke test (with --preset tiny)")
    p.add_argument("--json", type=Path)
    p.add_argument("--trace", type=Path, help="folder for the profile rows' timelines (trace_<row>.json.gz)")
    return p.parse_args()


class FixedBatches:
    """A BatchSource serving one batch forever (or `batches` in turn), already on the device."""

    def __init__(self, batches: list[dict]) -> None:
        self.batches, self.position = batches, 0

    def __next__(self) -> dict:
        batch = self.batches[self.position % len(self.batches)]
        self.position += 1
        return batch

    def state_dict(self) -> dict:
        return {"position": self.position}

    def load_state_dict(self, state: dict) -> None:
        self.position = state["position"]

    def timings(self) -> dict:
        return {}

    def close(self) -> None:
        pass


def _config(args, name: str, sets: list[str], steps: int, out: Path):
    import gr00t_train

    base = [f"model.preset={args.preset}", f"data.batch_size={args.batch}", f"device={args.device}", "precision=bf16",
            f"steps={steps}", f"logging.summary_skip={args.warmup}", "logging.every=10", "logging.progress=false",
            "logging.plots=false", "logging.tensorboard=false", "checkpoint.save_final=false",
            "optim.warmup_ratio=0", f"output_dir={out / name}", "optimizations.comm=overlap",
            "optimizations.graph=per_microbatch", "optimizations.compile=off"]  # fmt: skip
    return gr00t_train.load_config(overrides=[*base, *sets])


def _parts(cfg, env, batches: list[dict]):
    import gr00t_model
    from gr00t_train import TrainParts
    from gr00t_train.model import gr00t as _gr00t

    tokenizer = gr00t_model.load_tokenizer(None)
    model = _gr00t.build_model(cfg, env.device, tokenizer)
    flops, tokens = _gr00t.flops_and_tokens(model.config, 2, batches[0]["input_ids"].shape[1])
    return TrainParts(
        model=model, loss_fn=_gr00t.gr00t_loss, data=FixedBatches(batches), save_model=_gr00t.save_model,
        load_model=_gr00t.load_model_in_place, flops_per_sample=flops, tokens_per_sample=tokens,
        draw=_gr00t.make_draw(model, cfg.data.batch_size, env.device), frozen_prefix=model.frozen_prefix,
        compile_model=model.compile_blocks, row_tables=(_gr00t.embodiment_tables(model), "embodiment_id"),
        update_stages=model.repeated_blocks,
    )  # fmt: skip


def _batches(args, count: int = 1) -> list[dict]:
    import gr00t_model

    config = gr00t_model.GR00TConfig.preset(args.preset)
    return [gr00t_model.make_dummy_batch(config, args.batch, num_images=2, device=args.device, seed=s)
            for s in range(count)]  # fmt: skip


def run_ours(args, name, sets, out: Path, env, batches=None, steps=None, dropout=True) -> dict:
    import gr00t_train

    steps = steps or args.warmup + args.steps
    cfg = _config(args, name, sets, steps, out)
    batches = batches or _batches(args)
    if "one-embodiment" in name:  # as when fine-tuning on one robot: every sample in slot 10
        batches = [{**b, "embodiment_id": torch.full_like(b["embodiment_id"], 10)} for b in batches]
    with BUILT_WITH.get(
        name, contextlib.nullcontext
    )():  # held through the run: blocks compile at its first step
        parts = _parts(cfg, env, batches)
        if not dropout:
            parts.model.action_head.model.eval()  # the DiT's dropout is its only train-mode behaviour
        _cuda("reset_peak_memory_stats")
        trainer = gr00t_train.Trainer(cfg, parts, env)
        if name in PATCHES:
            PATCHES[name](trainer)
        summary = trainer.fit()
    row = {"row": name, "sets": sets, **summary.as_dict(), **trainer.run_facts()}
    row["losses"] = [json.loads(x)["loss"] for x in (out / name / "metrics.jsonl").read_text().splitlines()]
    parts.model.uncompile_blocks()  # the compiled forwards hold their blocks: let the model go
    del trainer, parts
    gc.collect()
    _cuda("synchronize")
    _cuda("empty_cache")
    return row


def _cuda(name: str, default=None):
    """torch.cuda.<name>() when CUDA is there (the CPU smoke test has none)."""
    return getattr(torch.cuda, name)() if torch.cuda.is_available() else default


def run_free(args, name: str) -> dict:
    """What a user gets for free: autocast, fused AdamW, eager or torch.compile(mode="reduce-overhead")."""
    import gr00t_model

    torch.manual_seed(0)
    config = gr00t_model.GR00TConfig.preset(args.preset)
    with torch.device(args.device):
        model = gr00t_model.GR00TN16(config).train()
    if args.device == "cuda":
        model.prepare_frozen_prefix()  # the same model as ours: frozen SigLIP2 MLPs padded (gr00t-train does it)
    batch = _batches(args)[0]
    params = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(params, lr=1e-4, fused=args.device == "cuda")
    forward = torch.compile(model, mode="reduce-overhead") if name == "free-reduce-overhead" else model
    _cuda("reset_peak_memory_stats")

    def step() -> torch.Tensor:
        optimizer.zero_grad(set_to_none=True)
        loss = forward(batch)["loss"]
        loss.backward()
        optimizer.step()
        return loss.detach()

    started = time.perf_counter()
    step()
    _cuda("synchronize")
    first = time.perf_counter() - started
    for _ in range(args.warmup):
        step()
    _cuda("synchronize")
    started = time.perf_counter()
    losses = [step() for _ in range(args.steps)]
    _cuda("synchronize")
    seconds = (time.perf_counter() - started) / args.steps
    flops = gr00t_model.training_flops_per_sample(
        config, num_images=2, vlm_tokens=batch["input_ids"].shape[1]
    )
    sps = args.batch / seconds
    return {"row": name, "samples_per_s": sps, "step_time_s": seconds, "mfu": sps * flops["train"] / 989e12,
            "first_step_s": first, "peak_memory_gib": _cuda("max_memory_allocated", 0) / 2**30,
            "final_loss": float(torch.stack(losses[-10:]).mean())}  # fmt: skip


_EAGER = ["optimizations.graph=eager", "optimizations.compile=off", "optimizations.optimizer_overlap=false",
          "optimizations.flat_optimizer=off"]  # fmt: skip


_EAGER_LOSSES: dict[str, list[float]] = {}
"""The eager parity run's losses, shared by every parity row of the process."""


def parity(args, out: Path, env, row: str = "ours-full") -> dict:
    """`row` vs eager, dropout off, the same batches and random draws: largest relative loss gap."""
    batches = _batches(args, 4)
    if "eager" not in _EAGER_LOSSES:
        _EAGER_LOSSES["eager"] = run_ours(args, "parity-eager", [*ROWS["ours-full"], *_EAGER], out, env, batches,
                                  steps=args.parity, dropout=False)["losses"]  # fmt: skip
    a = _EAGER_LOSSES["eager"]
    b = run_ours(args, f"parity-{row}", ROWS[row], out, env, batches, steps=args.parity, dropout=False)[
        "losses"
    ]
    gaps = [abs(x - y) / max(abs(x), 1e-12) for x, y in zip(a, b)]
    return {"row": row, "steps": len(gaps), "max_rel_diff": max(gaps), "mean_rel_diff": sum(gaps) / len(gaps),
            "eager_first_last": [a[0], a[-1]], "full_first_last": [b[0], b[-1]]}  # fmt: skip


def main() -> None:
    args = parse()
    torch.backends.cuda.matmul.allow_tf32 = True
    import gr00t_train

    out = Path("runs/step_variants")
    env = gr00t_train.init_distributed(args.device)
    cuda = args.device == "cuda"
    result = {"device": torch.cuda.get_device_name() if cuda else "cpu", "torch": torch.__version__, "rows": [],
              "date": time.strftime("%Y-%m-%d %H:%M")}  # fmt: skip
    try:
        for name in args.rows.split(","):
            started = time.perf_counter()
            try:
                if name.startswith("parity"):
                    compared = name.partition("=")[2] or "ours-full"
                    key = "parity" if compared == "ours-full" else f"parity_{compared}"
                    result[key] = parity(args, out, env, compared)
                    print(key, result[key], flush=True)
                elif name == "update-alone":
                    result["update_alone"] = update_alone(args, out, env)
                    print("update alone", result["update_alone"], flush=True)
                elif name.startswith("profile-ops"):
                    profiled = name.partition("=")[2] or "ours-full"
                    result.setdefault("ops_ms", {})[profiled] = found = profile_ops(args, out, env, profiled)
                    print(f"ops of {profiled} without graphs (ms per step)", *found["ops"][:20], sep="\n")
                elif name.startswith("profile"):
                    profiled = name.partition("=")[2] or "ours-full"
                    result.setdefault("kernel_families_ms", {})[profiled] = found = profile_row(
                        args, out, env, profiled
                    )
                    print(
                        f"kernel families of {profiled} (ms per step)",
                        json.dumps(found, indent=0),
                        flush=True,
                    )
                else:
                    row = run_free(args, name) if name in FREE else run_ours(args, name, ROWS[name], out, env)
                    row["row_wall_s"] = time.perf_counter() - started
                    result["rows"].append(row)
                    print(f"{name:28s} {row['samples_per_s']:7.1f} samples/s  MFU {100 * (row['mfu'] or 0):.1f}%  "
                          f"first step {row['first_step_s']:.1f} s  peak {row['peak_memory_gib'] or 0:.1f} GiB  "
                          f"breakdown {row.get('breakdown_s')} opt-side {row.get('optimizer_overlapped_s')}",
                          flush=True)  # fmt: skip
            except Exception:  # one broken variant must not hide the others' numbers
                traceback.print_exc()
                result.setdefault("errors", {})[name] = traceback.format_exc(limit=3)
            if args.json:
                args.json.write_text(json.dumps(result, indent=1))
    finally:
        gr00t_train.shutdown_distributed(env)
    if args.json:
        args.json.write_text(json.dumps(result, indent=1))


def profile_row(args, out: Path, env, row: str, active: int = 3) -> dict:
    """Kernel time by family (and the top kernels) over `active` steps of a row, after its warmup steps."""
    import gr00t_train
    from gr00t_train.metrics.profile import profile_steps

    cfg = _config(args, "profiled", ROWS[row], args.warmup + 3 + active, out)
    trainer = gr00t_train.Trainer(cfg, _parts(cfg, env, _batches(args)), env)
    if row in PATCHES:
        PATCHES[row](trainer)
    trace = None
    if args.trace:
        args.trace.mkdir(parents=True, exist_ok=True)
        trace = args.trace / f"trace_{row}.json.gz"
    _, found = profile_steps(trainer, skip=args.warmup + 3, active=active, trace=trace)
    trainer.parts.model.uncompile_blocks()
    del trainer
    gc.collect()
    _cuda("empty_cache")
    return found


def update_alone(args, out: Path, env, reps: int = 10) -> dict:
    """The update's passes timed alone after a few steps of the serial row (ms per call), and the same
    kernel over fresh buffers of the same size: is the update slower inside a step than on its own?"""
    import gr00t_train
    from vla_overlap._flat_adamw import plan_blocks
    from vla_overlap._flat_adamw_kernel import adamw_flat

    cfg = _config(args, "update-alone", ROWS["ours-serial"], args.warmup, out)
    trainer = gr00t_train.Trainer(cfg, _parts(cfg, env, _batches(args)), env)
    trainer.fit()
    flat = trainer.model.optimizer.flat

    found = {
        "elements": sum(b["master"].numel() for b in flat.buckets),
        "buckets": len(flat.buckets),
        "aligned_buckets": sum(b.get("align", 1) > 1 for b in flat.buckets),
        "grad_norm_ms": cuda_ms(lambda: flat.grad_norm(2.0), reps),
        "flat_step_ms": cuda_ms(lambda: flat.step(None), reps),
    }
    n = found["elements"]
    fresh = [torch.zeros(n, device="cuda") for _ in range(4)]
    out_bf16 = torch.zeros(n, device="cuda", dtype=torch.bfloat16)
    blocks, align = plan_blocks([(0, n, 0)], n)  # one run over the whole length
    blocks = torch.tensor(blocks, device="cuda")
    table = flat.table(torch.device("cuda"))
    found["one_run_fresh_buffers_ms"] = cuda_ms(
        lambda: adamw_flat(*fresh, out_bf16, blocks, table, None, align=align), reps
    )
    trainer.parts.model.uncompile_blocks()
    del trainer
    gc.collect()
    _cuda("empty_cache")
    return found


def profile_ops(args, out: Path, env, row: str, active: int = 2, top: int = 250) -> dict:
    """GPU time per torch op and input shapes (self time, ms per step) of a row run without CUDA graphs
    (graph replays hide the ops that launched each kernel): which op a copy or a small kernel comes from."""
    import gr00t_train
    from torch.profiler import ProfilerActivity, profile, schedule

    steps = args.warmup + 3 + active
    cfg = _config(args, "profiled-ops", [*ROWS[row], "optimizations.graph=eager"], steps, out)
    trainer = gr00t_train.Trainer(cfg, _parts(cfg, env, _batches(args)), env)
    plan = schedule(wait=args.warmup + 2, warmup=1, active=active, repeat=1)
    kinds = [ProfilerActivity.CPU, ProfilerActivity.CUDA]
    with profile(activities=kinds, schedule=plan, record_shapes=True) as prof:
        trainer.step_callback = prof.step
        trainer.fit()
    averages = prof.key_averages(group_by_input_shape=True)
    rows = sorted(averages, key=lambda e: e.self_device_time_total, reverse=True)[:top]
    found = {"ops": [[e.key, str(e.input_shapes)[:200], round(e.self_device_time_total / active / 1e3, 3),
                      round(e.count / active, 1)] for e in rows]}  # fmt: skip
    trainer.parts.model.uncompile_blocks()
    del trainer
    gc.collect()
    _cuda("empty_cache")
    return found


if __name__ == "__main__":
    main()
