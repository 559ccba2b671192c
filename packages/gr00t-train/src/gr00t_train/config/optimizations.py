"""The speed switches (`optimizations.*`) and how `auto` resolves on the run's device.

Every switch that keeps the numerics defaults to `auto`: on where the hardware supports it, so a plain
`gr00t-train train` on a CUDA GPU runs the ablation ladder's full exact stack and on a CPU the simple path.
`resolve_optimizations` turns every `auto` into the value the run uses (what checkpoints record) and says
in one line what is on, and why anything is off."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar, Literal

import torch

from .types import Section, require

if TYPE_CHECKING:
    from .sections import TrainConfig

DataMode = Literal["dataloader", "sync", "async"]
CommMode = Literal["auto", "allreduce_after_backward", "ddp", "overlap", "zero1_overlap"]
GraphMode = Literal["auto", "eager", "full_iteration", "per_microbatch"]
Switch = Literal["auto", "on", "off"]
"""A speed switch: auto (on where the device supports it), on, or off. true/false are read as on/off."""


@dataclass(kw_only=True)
class OptimizationsConfig(Section):
    """One switch per speed-up, so each row of the ablation ladder is one command line."""

    renamed_fields: ClassVar[dict[str, str]] = {"bucket_mb": "bucket_mib"}

    data: DataMode = "async"
    """async: vla-io's three-level pipeline; sync: the same, loaded in the training loop; dataloader: the
    LeRobot-style baseline (a torch DataLoader with workers over single samples, the processor in the
    workers, images prepared on the CPU)."""
    comm: CommMode = "auto"
    """Gradient communication: all-reduce after backward, torch DDP, overlapped buckets, or ZeRO-1 + overlap.
    auto = zero1_overlap on CUDA (or with bf16_weights=on), overlap on a CPU."""
    graph: GraphMode = "auto"
    """CUDA graphs: none (eager), the whole iteration as one graph, or one graph per microbatch (CUDA only).
    auto = per_microbatch on CUDA (eager with comm=ddp), eager on a CPU."""
    fused_optimizer: bool = True
    """Fused AdamW kernel (one launch for all parameters)."""
    tf32: bool = True
    """TF32 matmuls and convolutions for fp32 work on CUDA."""
    cudnn_benchmark: bool = True
    """cuDNN autotuning for fixed shapes."""
    gemm_workspace: Literal["auto", "zero", "default"] = "auto"
    """zero: no cuBLAS workspace, so cuBLAS picks its static-scheduler GEMM kernels. Its default
    dynamic-scheduler kernels need a 4-byte counter zeroed before each launch, and in a CUDA graph each such
    memset costs about 5 us of idle GPU (n1.6-3b: about 330 per step, +1.4% samples/s without them on an
    H200). Split-K GEMMs, which need a workspace, are then not chosen. auto = zero on CUDA with a graph mode.
    With torch 2.11 and older it works through CUBLAS_WORKSPACE_CONFIG=:0:0, which torch reads at the process's
    first GEMM (a value the caller set is kept; `gr00t-train train` and `bench`, for its last row, set it
    first thing). In a process that ran a GEMM before, cuBLAS keeps its default."""
    bucket_mib: float = 100.0
    """Gradient bucket size of our comm modes, in MiB of gradient buffer (fp32: 100 MiB = 26.2 M elements).
    Formerly `bucket_mb`, which configs and checkpoints may still use."""
    graph_warmup: int = 3
    """Eager steps before a CUDA graph is captured."""
    compile: Literal["auto", "on", "off"] = "auto"
    """torch.compile every repeated block of the model (vision, LLM and DiT blocks; each block type compiles
    once), captured inside the CUDA graphs. auto = on with CUDA, off on CPU."""
    compile_cache: str = "auto"
    """A file of torch.compile's cache artifacts (compiled graphs, Triton kernels, autotuning results) with
    Inductor's multi-kernel picks and our Triton kernels launched outside the graphs, for hosts whose local caches start empty (a
    fresh cloud host or container, or a preempted job resumed elsewhere). Loaded before the first compile
    when it exists; written by the main rank once the first step has compiled, unless it was loaded and
    nothing compiled anew. Entries hold only for the same torch, Triton, GPU and compiled graphs; the rest
    compiles as without it. auto = `<output_dir>/compile_cache.bin` (about 70 MB for n1.6-3b), so a resumed
    run starts from its own compilation; off (or empty) = not used; anything else is the file's path (one
    file may serve many runs)."""
    bf16_weights: Switch = "auto"
    """Hold the trainable matmul weights in bf16 (no per-step casts) with fp32 master weights and moments in
    the optimizer, which writes the bf16 copy; gradients accumulate in fp32 (where nothing accumulates, at one
    microbatch on one rank, the flat step reads them in bf16 in place: the same values). The same numbers as
    fp32 weights under autocast. Needs comm=zero1_overlap (the master weights live in its optimizer) and
    precision bf16. auto = on with CUDA on a GPU with bf16 (where comm resolves to zero1_overlap and precision
    is not fp32)."""
    fp8_frozen: bool = False
    """Compute the frozen prefix's linear layers (SigLIP2 encoder, connector, frozen Qwen3 layers) in FP8
    with rowwise scales, weights quantized once at start (CUDA with compute capability 8.9+). Changes the
    numerics, so it is off by default and has its own loss-parity row; needs the vision side frozen."""
    flat_optimizer: Literal["auto", "on", "off"] = "auto"
    """DistributedAdamW's one-pass Triton step: per gradient bucket, one kernel reads the gradient (clipped on
    the fly), updates the moments and the fp32 master and writes the bf16 weight (about 11 ms alone for
    n1.6-3b on an H200; torch's fused AdamW and the write-back 21-24 ms). auto = on with comm=zero1_overlap
    on CUDA; on needs both.
    """
    param_remainders: bool = True
    """Where the flat optimizer steps bf16 weights (bf16_weights, on CUDA): keep each fp32 master weight as its
    bf16 weight plus a 16-bit remainder while stepping (vla-overlap's `remainders`), so the update moves 26
    instead of 28 bytes per parameter: +1.7 samples/s for n1.6-3b on an H200 (BENCHMARKS.md, levers tried).
    A master at an exact rounding tie moves one fp32 ulp (about one element in 65536 per step); the bf16
    weight stays autocast's rounding of the master, and checkpoints hold fp32 masters. The remainders take 2
    bytes per trainable parameter of memory (the fp32 masters stay allocated for checkpoints)."""
    triton_attention: Literal["auto", "on", "off"] = "auto"
    """The DiT's attention through gr00t-model's Triton flash kernels (GR00TConfig.triton_attention) instead of
    SDPA's (BENCHMARKS.md, levers tried). auto = on with CUDA; elsewhere SDPA runs either way."""
    weight_grads_in_place: bool = True
    """Where the gradient buffers hold the weights' own dtype (bf16 weights with the flat step, one microbatch,
    one rank), each trainable nn.Linear's weight-gradient GEMM writes its buffer directly instead of a new
    tensor that a hook then copies (vla-overlap's `write_weight_grads_in_place`). The same GEMM, one pass over
    the gradients fewer."""
    grouped_embodiment_gemms: Literal["auto", "on", "off"] = "auto"
    """Compute the per-embodiment projections (state/action encoders, action decoder) as one grouped GEMM per
    layer over the batch sorted by slot, instead of the release's per-sample gather of each slot's matrix
    (GR00TConfig.grouped_embodiment_gemms); with bf16_weights their tables are then held in bf16 too. The
    same products, each slot's weight gradient summed in one GEMM. auto = on with CUDA."""
    merged_dit_linears: Literal["auto", "on", "off"] = "auto"
    """The DiT's linears that read one input as one GEMM each: every block's AdaLN projection with proj_out_1,
    and each self-attention block's q, k and v (GR00TConfig.merged_dit_linears; checkpoints keep the release's
    names). The same products in fewer, larger GEMMs. auto = on with CUDA."""
    skip_untouched_rows: bool = True
    """With the flat optimizer: the update skips the rows of the per-embodiment tables that no batch has touched
    (vla-overlap's `track_rows`; at more than one rank, no rank's batch). Their gradients and moments are zero, so AdamW would move them by
    weight decay alone, which the step still applies (and which rounds to nothing at lr 1e-4, weight decay
    1e-5): the same result. Fine-tuning on one embodiment, 31 of 32 slots (20% of n1.6-3b's trainable weights)
    are never touched."""
    optimizer_overlap: Switch = "auto"
    """Run the optimizer step on a side CUDA stream while the next step's frozen forward (vision tower and
    frozen LLM layers, which read no trainable weight) runs; the trainable part waits for it. auto = on with
    CUDA."""
    staged_update: bool = True
    """With optimizer_overlap and the flat optimizer at one GPU: step the parameters in the order the forward
    first reads them, a fence after each trainable block, so each block waits only for its own parameters and
    the update's tail runs beside the first trainable layers (vla-overlap's `stage_update`); the same
    arithmetic, bitwise, in another order."""
    grad_reduce_dtype: Literal["float32", "bfloat16"] = "float32"
    """The dtype gradients travel in between ranks (bfloat16: half the bytes); they accumulate in fp32 either
    way. Not with comm=ddp."""
    sync_in_graph: bool = True
    """With a graph mode and comm=overlap or zero1_overlap: capture the gradient collectives in the graph that
    holds the last microbatch, launched bucket by bucket from its backward, so they overlap with it at replay
    (else they run after the replay, exposed). The exposed part is then inside `compute` in the breakdown."""

    def _check(self) -> None:
        require(self.bucket_mib > 0, "bucket_mib", f"must be > 0, got {self.bucket_mib}")
        require(self.graph_warmup >= 1, "graph_warmup", f"must be >= 1, got {self.graph_warmup}")
        require(
            self.bf16_weights != "on" or self.comm in ("zero1_overlap", "auto"),
            "bf16_weights",
            f"needs comm=zero1_overlap (its optimizer holds the fp32 master weights), got comm={self.comm!r}",
        )
        require(
            self.flat_optimizer != "on" or self.comm in ("zero1_overlap", "auto"),
            "flat_optimizer",
            f"is DistributedAdamW's step: needs comm=zero1_overlap, got comm={self.comm!r}",
        )
        require(
            self.comm != "ddp" or self.grad_reduce_dtype == "float32",
            "grad_reduce_dtype",
            "bfloat16 reduction needs one of our comm modes (overlap, zero1_overlap, allreduce_after_backward)",
        )
        require(
            self.comm != "ddp" or self.graph in ("eager", "auto"),
            "graph",
            f"{self.graph!r} cannot run with comm='ddp' (torch DDP communicates from autograd hooks, which "
            "do not fire during graph replay); use comm=overlap or zero1_overlap with graphs",
        )


_BF16_CAPABILITY = (8, 0)
"""bf16 tensor cores and our Triton kernels' bf16 paths need Ampere or newer."""


def resolve_optimizations(
    cfg: TrainConfig, device: str | torch.device, capability: tuple[int, int] | None = None
) -> tuple[TrainConfig, str]:
    """A copy of `cfg` whose `auto` switches (and precision on CUDA) hold what runs on `device`, and one line
    saying what is on and why anything is off. `capability` (major, minor) of the GPU: read from `device`
    when None. Resolving a resolved config changes nothing."""
    kind = torch.device(device).type
    cuda = kind == "cuda"
    if cuda and capability is None:
        capability = torch.cuda.get_device_capability(torch.device(device))
    modern = cuda and tuple(capability or (0, 0)) >= _BF16_CAPABILITY
    opts = cfg.optimizations
    precision = cfg.precision
    if precision == "auto" and (cuda or opts.bf16_weights == "on"):
        precision = "bf16" if modern or not cuda else "fp32"
    comm = opts.comm
    if comm == "auto":
        wants_zero1 = cuda or "on" in (opts.bf16_weights, opts.flat_optimizer)
        comm = "zero1_overlap" if wants_zero1 else "overlap"
    no_gpu = "needs CUDA" if not cuda else f"needs compute capability {_BF16_CAPABILITY[0]}.0+"
    zero1 = comm == "zero1_overlap"
    lora = cfg.model.lora.rank > 0
    # (on where `auto`, the reason when not), from the device and the modes chosen above
    choices = {
        "graph": (
            cuda and comm != "ddp",
            "needs CUDA" if not cuda else "torch DDP (comm=ddp) cannot run in graphs",
        ),
        "compile": (cuda, "needs CUDA"),
        "bf16_weights": (
            modern and zero1 and precision != "fp32",
            no_gpu if not modern else "needs comm=zero1_overlap" if not zero1 else "needs precision bf16",
        ),
        "optimizer_overlap": (cuda, "needs CUDA"),
        "flat_optimizer": (modern and zero1, no_gpu if not modern else "needs comm=zero1_overlap"),
        "grouped_embodiment_gemms": (cuda, "needs CUDA"),
        "merged_dit_linears": (
            cuda and not lora,
            "LoRA adapts each projection (model.lora.rank)" if lora else "needs CUDA",
        ),
        "triton_attention": (modern, no_gpu),
    }
    values = {}
    for name, (on, _) in choices.items():
        value = getattr(opts, name)
        if value == "auto":
            value = ("per_microbatch" if on else "eager") if name == "graph" else ("on" if on else "off")
        values[name] = value
    workspace = opts.gemm_workspace
    if workspace == "auto":
        workspace = "zero" if cuda and values["graph"] != "eager" else "default"
    resolved = dataclasses.replace(opts, comm=comm, gemm_workspace=workspace, **values)
    out = dataclasses.replace(cfg, precision=precision, optimizations=resolved)
    why = {name: reason for name, (on, reason) in choices.items() if not on}
    return out, _describe(out, kind, why)


_HEADLINE = (
    "graph", "compile", "bf16_weights", "optimizer_overlap", "flat_optimizer", "grouped_embodiment_gemms",
    "merged_dit_linears", "triton_attention", "staged_update", "skip_untouched_rows", "param_remainders",
    "fp8_frozen",
)  # fmt: skip
"""The switches the start-up line names (data and comm are named by their mode)."""


def _describe(cfg: TrainConfig, kind: str, why: dict[str, str]) -> str:
    opts = cfg.optimizations
    flat = opts.flat_optimizer == "on"
    needs = {  # switches that act only on top of others
        "staged_update": (
            opts.optimizer_overlap == "on" and flat,
            "needs optimizer_overlap and flat_optimizer",
        ),
        "skip_untouched_rows": (opts.comm == "zero1_overlap", "needs comm=zero1_overlap"),
        "param_remainders": (flat and opts.bf16_weights == "on", "needs flat_optimizer and bf16_weights"),
    }
    on: list[str] = []
    off: dict[str, list[str]] = {}  # reason -> switches, so a CPU run's line stays short
    for name in _HEADLINE:
        value = getattr(opts, name)
        if value is True and name in needs and not needs[name][0]:
            off.setdefault(needs[name][1], []).append(name)
        elif value in (True, "on") or (name == "graph" and value != "eager"):
            on.append(name if name != "graph" else f"graph={value}")
        elif name == "fp8_frozen":
            off.setdefault(
                "changes the numerics: opt in with --set optimizations.fp8_frozen=true", []
            ).append(name)
        else:
            off.setdefault(why.get(name, f"set to {str(value).lower()}"), []).append(name)
    off_text = "; ".join(f"{', '.join(names)} ({reason})" for reason, names in off.items())
    head = f"optimizations on {kind}: data={opts.data}, comm={opts.comm}, precision={cfg.precision}"
    return f"{head}; on: {', '.join(on) or 'none'}; off: {off_text or 'none'}"
