"""memory.budget_gib: choose the techniques that fit a run in a device-memory budget, before the model is built.

`plan_for_budget` predicts the peak (`memory.plan`) of the model the run will build (built on the meta
device: the same parameters, dtypes and prepared frozen copies, no memory), then adds techniques in order of
their cost to speed until the prediction fits: the flat step's master remainders dropped
(optimizations.param_remainders=false), recompute the DiT blocks, 8-bit AdamW moments (where vla-overlap
offers them), recompute the trainable LLM layers, then halve the microbatch with gradient accumulation so the
effective batch stays. Blocks are recomputed selectively first (memory.recompute_policy=auto: their GEMM and
attention outputs kept, no GEMM run again), then fully (inputs only) where that is not enough. Settings the
user gave (memory.recompute, a recompute_policy other than auto, memory.adam_moments, optim.grad_accum) are
kept as given. Nothing fitting stops the run (exit 2) naming memory.budget_gib.
The chosen techniques and the prediction per component are logged in one block; after step 1 the trainer
logs the measured peak beside it, and both go into summary.json."""

from __future__ import annotations

import dataclasses
import inspect
import logging
import os
from dataclasses import dataclass, field

import torch

from .._comm import adam_moments
from .._errors import ConfigError
from ..config.sections import TrainConfig
from .activations import shapes_of
from .plan import COMPONENTS, GiB, Prediction, predict, resolved_policy

log = logging.getLogger(__name__)
CAP_ENV = "GR00T_TRAIN_MEMORY_CAP_GIB"
"""For benchmarks and tests: cap this process's CUDA caching allocator at this many GiB
(torch.cuda.set_per_process_memory_fraction), to emulate a smaller card on a large one."""
NOT_AVAILABLE = {
    "optimizer state offload": "not implemented",
    "fp32 masters held only as bf16 + remainder": "vla-overlap keeps the fp32 masters allocated (checkpoints "
    "read them) beside the remainders; the planner drops the remainders instead",
    "optimizations.fp8_frozen": "keeps the bf16 weights (checkpoints and the state dict need them) and adds "
    "an FP8 copy: it costs memory, never saves it",
}
"""Techniques that save memory elsewhere and that the planner does not choose, and why."""
HEADROOM = 0.92
"""A plan fits when its predicted peak (allocated bytes) is within this share of the budget: the caching
allocator reserves more than it hands out (fragmentation), and a cap limits what it reserves."""


def int8_moments_available() -> bool:
    """Whether vla-overlap's DistributedAdamW offers 8-bit moments (its `moments` argument)."""
    import vla_overlap

    return "moments" in inspect.signature(vla_overlap.DistributedAdamW.__init__).parameters


@dataclass
class MemoryPlan:
    """What the planner chose for memory.budget_gib and what it predicts."""

    budget_gib: float
    techniques: list[str]
    microbatch: int
    grad_accum: int
    moments: str
    prediction: Prediction
    kept: list[str] = field(default_factory=list)
    """Settings the user gave that the planner left alone."""
    sample: str = ""
    """The sample the activations were predicted for (cameras, tokens)."""
    measured_step1_gib: float | None = None
    recompute: str = "none"
    """The recomputed blocks and their policy (memory.recompute, memory.recompute_policy), as the run has them."""

    def block(self) -> str:
        """The start-up block: budget, chosen techniques, the predicted peak per component."""
        gib = self.prediction.gib()
        chosen = ", ".join(self.techniques) or "none needed"
        lines = [
            f"memory budget {self.budget_gib:g} GiB (memory.budget_gib): {chosen}; microbatch "
            f"{self.microbatch} x {self.grad_accum} accumulated (effective batch {self.microbatch * self.grad_accum} "
            f"per rank); AdamW moments {self.moments}",
            f"  activation recompute: {self.recompute}",
            f"  predicted peak per rank {gib['total']:.2f} GiB (a sample of {self.sample}):",
            *(f"    {name.replace('_', ' '):<18} {gib[name]:6.2f} GiB" for name in COMPONENTS),
        ]
        lines += [f"  kept as you set it: {k}" for k in self.kept]
        lines += [f"  not used: {name} ({why})" for name, why in NOT_AVAILABLE.items()]
        if not int8_moments_available():
            lines.append(
                "  not used: 8-bit AdamW moments (this vla-overlap has no DistributedAdamW(moments=...))"
            )
        return "\n".join(lines)

    def after_first_step(self, env) -> None:
        """Log the measured peak of step 1 (CUDA) beside the prediction, and keep it for summary.json."""
        if env.device.type != "cuda":
            return
        self.measured_step1_gib = round(torch.cuda.max_memory_allocated(env.device) / GiB, 2)
        if env.is_main:
            log.info(
                "memory after step 1: measured peak %.2f GiB, predicted %.2f GiB (budget %g GiB)",
                self.measured_step1_gib, self.prediction.total / GiB, self.budget_gib,
            )  # fmt: skip

    def facts(self, run_peak_gib: float | None) -> dict:
        """summary.json's `memory_plan`."""
        return {
            "budget_gib": self.budget_gib,
            "techniques": self.techniques,
            "microbatch": self.microbatch,
            "grad_accum": self.grad_accum,
            "adam_moments": self.moments,
            "kept": self.kept,
            "recompute": self.recompute,
            "predicted_gib": self.prediction.gib(),
            "predicted_detail_gib": {k: round(v / GiB, 4) for k, v in self.prediction.detail.items()},
            "measured_peak_step1_gib": self.measured_step1_gib,
            "measured_peak_run_gib": run_peak_gib,
        }


def apply_memory_cap(device: torch.device) -> float | None:
    """Cap the CUDA allocator at $GR00T_TRAIN_MEMORY_CAP_GIB (benchmarks emulating a smaller card); returns
    the cap in GiB, or None when unset or not on CUDA."""
    value = os.environ.get(CAP_ENV)
    if not value or device.type != "cuda":
        return None
    try:
        cap = float(value)
    except ValueError:
        raise ConfigError("", f"${CAP_ENV}={value!r} is not a number of GiB") from None
    total = torch.cuda.get_device_properties(device).total_memory
    torch.cuda.set_per_process_memory_fraction(min(1.0, cap * GiB / total), device)
    log.info("CUDA memory capped at %.1f GiB ($%s)", cap, CAP_ENV)
    return cap


def plan_for_budget(cfg: TrainConfig, env) -> tuple[TrainConfig, MemoryPlan | None]:
    """`cfg` (resolved) with the techniques that fit memory.budget_gib, and the plan; (cfg, None) without
    a budget. Raises ConfigError (memory.budget_gib) when nothing fits."""
    budget = cfg.memory.budget_gib
    if budget is None:
        resolved_moments(cfg)  # int8 asked for where vla-overlap lacks it: refused before the model is built
        return cfg, None
    model, shapes = meta_model(cfg, env.device)
    steps, kept = ladder(cfg)

    def trial(chosen: list) -> tuple:
        """(config, moments, prediction) with the techniques `chosen` (name, change) applied in order."""
        candidate = cfg
        for _, change in chosen:
            candidate = change(candidate)
        moments = resolved_moments(candidate)
        prediction = predict(model, candidate, world_size=env.world_size, device_type=env.device.type,
                             shapes=shapes, moments=moments)  # fmt: skip
        return candidate, moments, prediction

    def fits(prediction: Prediction) -> bool:
        return prediction.total <= HEADROOM * budget * GiB

    tried = [(steps[:k], *trial(steps[:k])) for k in range(len(steps) + 1)]
    fitting = next((t for t in tried if fits(t[3])), None)
    if fitting is None:
        chosen, _, _, prediction = min(tried, key=lambda t: t[3].total)
        gib = prediction.gib()
        parts = ", ".join(f"{k.replace('_', ' ')} {gib[k]:.2f}" for k in COMPONENTS)
        names = ", ".join(_names(chosen)) or "as set"
        raise ConfigError(
            "memory.budget_gib",
            f"{budget:g} GiB per GPU cannot hold this run: its smallest plan ({names}) predicts a peak of "
            f"{gib['total']:.2f} GiB ({parts}), over {HEADROOM:.0%} of the budget (the allocator's slack). "
            "Raise the budget, train fewer layers (model.tune_top_llm_layers) or use LoRA (model.lora.rank)",
        )
    chosen = fitting[0]
    # The ladder added techniques one by one; one added earlier may be unneeded once a later one is in (8-bit
    # moments alone may fit where recomputing came first): leave out each that the rest fits without, the
    # costliest first. Microbatches replace one another and are left as found.
    for step in reversed(chosen[:-1]):
        rest = [s for s in chosen if s is not step]
        if not step[0].startswith("microbatch") and fits(trial(rest)[2]):
            chosen = rest
    candidate, moments, prediction = trial(chosen)
    chosen = _names(chosen)
    # int8 chosen is recorded as such; fp32 stays `auto`, as runs without a budget record it
    final = _memory(candidate, adam_moments="int8") if moments == "int8" else candidate
    cameras = len(cfg.data.cameras) if cfg.data.cameras else 2
    prompt = "" if cfg.model.vlm_seq_len else ", the prompt at its default length"
    sample = f"{cameras} camera(s): {shapes.vlm_tokens} VLM and {shapes.action_tokens} action tokens{prompt}"
    plan = MemoryPlan(
        budget,
        chosen,
        final.data.batch_size,
        final.optim.grad_accum,
        moments,
        prediction,
        kept,
        sample=sample,
        recompute=recompute_summary(final),
    )
    if env.is_main:
        log.info("%s", plan.block())
    return final, plan


def recompute_summary(cfg: TrainConfig) -> str:
    """The recomputed blocks and what they keep, for the start-up block: `dit, llm (selective: inputs, GEMM
    and attention outputs)`, or none."""
    blocks = cfg.memory.recompute
    if not blocks:
        return "none"
    policy = resolved_policy(cfg)
    keeps = "inputs only" if policy == "full" else "inputs, GEMM and attention outputs"
    return f"{', '.join(blocks)} ({policy}: {keeps})"


def resolved_moments(cfg: TrainConfig) -> str:
    """memory.adam_moments as the run uses it (auto: fp32)."""
    value = cfg.memory.adam_moments
    if value == "int8" and not int8_moments_available():
        raise ConfigError(
            "memory.adam_moments",
            "int8 needs vla-overlap's DistributedAdamW(moments=...), which this installation lacks",
        )
    if value == "int8" and cfg.optimizations.comm != "zero1_overlap":
        raise ConfigError(
            "memory.adam_moments",
            f"int8 moments live in ZeRO-1's DistributedAdamW: needs optimizations.comm=zero1_overlap, the run "
            f"has {cfg.optimizations.comm}",
        )
    return adam_moments(cfg)


def ladder(cfg: TrainConfig) -> tuple[list, list[str]]:
    """The techniques to try, cheapest first, as (name, config -> config), and the user's settings kept."""
    steps, kept = [], []

    def recompute(block: str, policy: str):
        return lambda c: _memory(c, recompute=sorted({*c.memory.recompute, block}), recompute_policy=policy)

    # selective first where the policy is free (auto): it recomputes no GEMM but keeps more than full
    policy = cfg.memory.recompute_policy
    first = "full" if policy == "full" else "selective"
    how = "" if first == "full" else " (selective)"

    opts = cfg.optimizations
    if opts.param_remainders and opts.bf16_weights == "on" and opts.flat_optimizer == "on":
        # the flat step's 16-bit remainders sit beside the fp32 masters: 2 bytes per trainable parameter
        # (3 GiB for n1.6-3b) for about 0.6% of speed (BENCHMARKS.md, levers tried)
        steps.append(("no master remainders", lambda c: _optimizations(c, param_remainders=False)))
    if cfg.memory.recompute:
        kept.append(f"memory.recompute={list(cfg.memory.recompute)}")
    if policy != "auto":
        kept.append(f"memory.recompute_policy={policy}")
    if not cfg.memory.recompute:
        steps.append((f"recompute dit{how}", recompute("dit", first)))
    if cfg.memory.adam_moments != "auto":
        kept.append(f"memory.adam_moments={cfg.memory.adam_moments}")
    elif int8_moments_available() and cfg.optimizations.comm == "zero1_overlap":
        steps.append(("8-bit AdamW moments", lambda c: _memory(c, adam_moments="int8")))
    if not cfg.memory.recompute:
        steps.append((f"recompute llm{how}", recompute("llm", first)))
        if policy == "auto":  # the blocks chosen so far recomputed whole
            steps.append(("recompute fully", lambda c: _memory(c, recompute_policy="full")))
    if cfg.optim.grad_accum != 1:
        kept.append(f"optim.grad_accum={cfg.optim.grad_accum}")
    else:
        batch = cfg.data.batch_size
        for micro in (m for m in range(batch - 1, 0, -1) if batch % m == 0 and _halving(batch, m)):
            steps.append((f"microbatch {micro} x {batch // micro}", _microbatch(micro, batch // micro)))
    return steps, kept


def _names(chosen: list) -> list[str]:
    """The techniques' names, the microbatch only as the last one tried (each replaces the one before)."""
    names = [name for name, _ in chosen]
    micro = [n for n in names if n.startswith("microbatch")]
    return [n for n in names if not n.startswith("microbatch") or n == micro[-1]]


def _halving(batch: int, micro: int) -> bool:
    """Microbatches tried: the divisors of the batch that halve (or more) the previous one tried."""
    return (batch // micro) & (batch // micro - 1) == 0 or micro == 1


def _memory(cfg: TrainConfig, **changes) -> TrainConfig:
    return dataclasses.replace(cfg, memory=dataclasses.replace(cfg.memory, **changes))


def _optimizations(cfg: TrainConfig, **changes) -> TrainConfig:
    return dataclasses.replace(cfg, optimizations=dataclasses.replace(cfg.optimizations, **changes))


def _microbatch(micro: int, accum: int):
    return lambda c: dataclasses.replace(
        c,
        data=dataclasses.replace(c.data, batch_size=micro),
        optim=dataclasses.replace(c.optim, grad_accum=accum),
    )


def meta_model(cfg: TrainConfig, device: torch.device):
    """The model `cfg` builds, on the meta device (no memory), prepared as the run prepares it on `device`,
    and its shapes for data.cameras (2 when not named) at model.vlm_seq_len."""
    import gr00t_model
    from gr00t_model import GR00TN16, GR00TConfig

    from ..model import gr00t as _gr00t

    tokenizer = gr00t_model.load_tokenizer(_gr00t.tokenizer_path(cfg))
    config = GR00TConfig.preset(cfg.model.preset, **_gr00t.model_overrides(cfg, device, tokenizer))
    with torch.device("meta"):
        model = _gr00t.add_adapters(cfg, GR00TN16(config).train())
    if device.type == "cuda" or cfg.optimizations.fp8_frozen:
        model.prepare_frozen_prefix(fp8=cfg.optimizations.fp8_frozen)
    cameras = len(cfg.data.cameras) if cfg.data.cameras else 2
    return model, shapes_of(model, cameras, cfg.model.vlm_seq_len)
