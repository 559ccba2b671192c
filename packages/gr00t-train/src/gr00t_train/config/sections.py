"""The training configuration: nested dataclasses, validated on construction.

Every field has a default, can be set from a TOML/YAML file and overridden on the command line with
`--set section.field=value` (see `config.io`). Errors name the dotted field and the allowed values."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from ..data.mixture import MixtureEntry, check_mixture
from ..prefix_cache.config import PrefixCacheConfig
from .optimizations import OptimizationsConfig
from .types import Section as _Section
from .types import require


@dataclass(kw_only=True)
class DataConfig(_Section):
    """What to read and how to batch it."""

    dataset: str = ""
    """Root folder of a LeRobot dataset (v2.0, v2.1 or v3.0; GR00T's meta/modality.json is optional). It is
    only read: statistics it lacks are computed once and cached in vla-io's user cache folder."""
    mixture: list[MixtureEntry] | None = None
    """Several datasets in one run instead of `dataset`: a list of entries (dataset, weight, cameras,
    embodiment_tag, state_keys, action_keys, modality_file, name), each sampled by its weight and normalized
    with its own statistics; the per-dataset keys of this section stay unset. See the README (Mixtures)."""
    cameras: list[str] | None = None
    """Camera (video) keys to feed the model, in order (full keys, or names without `observation.images.`,
    or modality.json's names); None = every camera of the dataset. Any sizes and aspect ratios."""
    state_keys: list[str] | None = None
    """State: dataset features (e.g. observation.state; a feature whose `names` is a dict of lists is split
    into those groups) and/or modality.json groups, in order; None = modality.json's state groups, else the
    `observation.state` feature as one group."""
    action_keys: list[str] | None = None
    """Action: the same choice as state_keys; None = modality.json's action groups, else `action`."""
    modality_file: str | None = None
    """A modality.json (GR00T's joint groups and camera names) to use instead of the dataset's own
    meta/modality.json: groups for a read-only dataset without writing into it."""
    augment_backend: Literal["torch", "dali", "auto"] = "auto"
    """Image work on the device (per-camera letterbox + resize, crop, color jitter, normalization) with
    vla-io's torch or DALI backend; auto = the backend recorded as faster on that device when installed,
    else torch."""
    action_horizon: int | None = None
    """Action steps per sample read from the dataset (the embodiment's chunk); None = the model's horizon."""
    embodiment_tag: str = "new_embodiment"
    """Embodiment of the dataset, selecting the model's per-embodiment projector slot."""
    batch_size: int = 16
    """Samples per device per microbatch."""
    num_workers: int = 4
    """Decoding worker processes (async data only)."""
    prefetch: int = 2
    """Batches each decoding worker keeps ready ahead of the host thread: vla-io's `prefetch_per_worker`, so
    level 1 of the pipeline holds num_workers x prefetch batches (levels 2 and 3 are double buffers). Not
    used by data=dataloader (its torch DataLoader keeps 2 per worker)."""
    decode_device: Literal["cpu", "cuda"] = "cpu"
    """Where video frames are decoded (cuda = NVDEC)."""
    augment: bool = True
    """Random crop + color jitter during training, as the release fine-tunes."""
    shuffle: bool = True
    """Shuffle the sample order (seeded; resumable)."""
    worker_timeout_s: float = 120.0
    """Stop with an error when a data worker has not delivered a batch for this long (a stalled decoder)."""
    max_bad_fraction: float = 0.01
    """Samples whose video fails to decode are skipped (replaced by another sample, with a warning per
    episode); the run stops (exit 2) once more than this fraction of the samples seen was skipped."""
    val_episodes: float = 0.05
    """Episodes held out of training for validation (eval.every): a whole number (>= 1) of episodes, or a
    fraction in (0, 1) of the dataset's episodes, rounded down; 0 = none. The held-out episodes are spread
    evenly over the dataset's episode order (deterministic: the same for every run of the dataset)."""
    prefix_cache: PrefixCacheConfig = field(default_factory=PrefixCacheConfig)
    """Train from stored features of the frozen prefix instead of video (`prefix_cache/config.py`)."""

    def _check(self) -> None:
        check_mixture(self)
        val = self.val_episodes
        require(
            val >= 0 and (val < 1 or float(val).is_integer()),
            "val_episodes",
            f"must be 0, a whole number of episodes or a fraction in (0, 1), got {val}",
        )
        require(self.batch_size >= 1, "batch_size", f"must be >= 1, got {self.batch_size}")
        timeout = self.worker_timeout_s
        require(timeout > 0, "worker_timeout_s", f"must be > 0 seconds, got {timeout}")
        bad = self.max_bad_fraction
        require(0 <= bad <= 1, "max_bad_fraction", f"must be in [0, 1] (0 = stop at the first), got {bad}")
        require(self.num_workers >= 0, "num_workers", f"must be >= 0, got {self.num_workers}")
        require(self.prefetch >= 1, "prefetch", f"must be >= 1, got {self.prefetch}")
        horizon = self.action_horizon
        require(horizon is None or horizon >= 1, "action_horizon", f"must be >= 1 or none, got {horizon}")
        for name in ("cameras", "state_keys", "action_keys"):
            keys = getattr(self, name)
            require(keys is None or len(keys) > 0, name, "must list at least one key, or be none (all)")
            require(keys is None or len(set(keys)) == len(keys), name, f"lists a key twice: {keys}")


@dataclass(kw_only=True)
class LoRAConfig(_Section):
    """Low-rank adapters instead of full fine-tuning (gr00t_model.add_lora)."""

    rank: int = 0
    """Adapter rank; 0 = no adapters: the trainable set trains in full."""
    alpha: float | None = None
    """The adapters' scale numerator (their update is alpha / rank x B A); None = 2 x rank."""
    dropout: float = 0.0
    """Dropout on the adapters' input while training."""
    targets: list[str] | None = None
    """Module-name patterns (fnmatch) whose trainable nn.Linear layers get adapters; None = the DiT's attention
    and feed-forward projections and the trainable language-model layers' projections
    (gr00t_model.DEFAULT_LORA_TARGETS)."""
    train_in_full: list[str] = field(
        default_factory=lambda: [
            "action_head.state_encoder",
            "action_head.action_encoder",
            "action_head.action_decoder",
        ]
    )
    """Modules that train in full beside the adapters (everything else is frozen): by default the embodiment
    projectors, whose slot of a new embodiment starts untrained."""

    def _check(self) -> None:
        require(self.rank >= 0, "rank", f"must be >= 0 (0 = no adapters), got {self.rank}")
        require(self.alpha is None or self.alpha > 0, "alpha", f"must be > 0 or none, got {self.alpha}")
        require(0 <= self.dropout < 1, "dropout", f"must be in [0, 1), got {self.dropout}")


@dataclass(kw_only=True)
class ModelConfig(_Section):
    """Which GR00T model to build and what of it to train."""

    preset: str = "n1.6-3b"
    """A gr00t_model preset name (for example tiny, n1.6-3b)."""
    checkpoint: str | None = None
    """Initial weights: a directory that gr00t_model.from_pretrained loads; None = random init."""
    tokenizer: str | None = None
    """A local Hugging Face tokenizer directory; None = the model package's offline default."""
    action_horizon: int | None = None
    """Actions predicted per sample; None = the preset's."""
    tune_llm: bool | None = None
    """Train the whole language model; None = the preset's."""
    tune_visual: bool | None = None
    """Train the vision tower and connector; None = the preset's."""
    tune_top_llm_layers: int | None = None
    """Train this many top language-model layers; None = the preset's."""
    vlm_seq_len: int | None = None
    """Pad the VLM token sequence to this fixed length (graphs need fixed shapes); None = automatic."""
    lora: LoRAConfig = field(default_factory=LoRAConfig)
    """LoRA adapters instead of full fine-tuning of the trainable set (`lora.rank` 0: none)."""

    def _check(self) -> None:
        require(bool(self.preset), "preset", "must name a gr00t_model preset")
        for name in ("action_horizon", "vlm_seq_len"):
            value = getattr(self, name)
            require(value is None or value >= 1, name, f"must be >= 1 or none, got {value}")
        top = self.tune_top_llm_layers
        require(top is None or top >= 0, "tune_top_llm_layers", f"must be >= 0 or none, got {top}")


@dataclass(kw_only=True)
class OptimConfig(_Section):
    """AdamW with a cosine schedule after a linear warmup, and global grad-norm clipping."""

    lr: float = 1e-4
    """Peak learning rate."""
    weight_decay: float = 1e-5
    """Decoupled weight decay on matrices (not on biases, norms or embeddings' 1-d parameters)."""
    betas: tuple[float, float] = (0.9, 0.999)
    """Adam betas."""
    eps: float = 1e-8
    """Adam epsilon."""
    warmup_ratio: float = 0.05
    """Fraction of the steps spent warming up linearly from 0 to lr."""
    min_lr_ratio: float = 0.0
    """The cosine decays to lr * min_lr_ratio."""
    grad_clip: float = 1.0
    """Clip the global gradient norm to this value; 0 = no clipping."""
    grad_accum: int = 1
    """Microbatches per optimizer step."""

    def _check(self) -> None:
        require(self.lr > 0, "lr", f"must be > 0, got {self.lr}")
        require(self.weight_decay >= 0, "weight_decay", f"must be >= 0, got {self.weight_decay}")
        require(all(0 <= b < 1 for b in self.betas), "betas", f"each must be in [0, 1), got {self.betas}")
        require(self.eps > 0, "eps", f"must be > 0, got {self.eps}")
        require(0 <= self.warmup_ratio < 1, "warmup_ratio", f"must be in [0, 1), got {self.warmup_ratio}")
        require(0 <= self.min_lr_ratio <= 1, "min_lr_ratio", f"must be in [0, 1], got {self.min_lr_ratio}")
        require(self.grad_clip >= 0, "grad_clip", f"must be >= 0 (0 = off), got {self.grad_clip}")
        require(self.grad_accum >= 1, "grad_accum", f"must be >= 1, got {self.grad_accum}")


@dataclass(kw_only=True)
class CheckpointConfig(_Section):
    """When and where checkpoints are written, and what to resume from."""

    dir: str | None = None
    """Checkpoint folder; None = <output_dir>/checkpoints."""
    every: int = 0
    """Save every this many steps; 0 = only at the end."""
    keep_last: int = 3
    """Keep only the newest this many checkpoints."""
    save_final: bool = True
    """Save after the last step."""
    resume: str | None = None
    """Resume from a checkpoint folder, or `auto` for the newest intact one in `dir`; None = start fresh."""
    existing_run: Literal["error", "new_run", "overwrite"] = "error"
    """A fresh run into a folder that holds another run's files: error (exit 2), new_run (move them to
    `previous-runs/<run id>/` and start afresh) or overwrite (delete them). `--new-run`, `--overwrite`."""
    resume_changed: list[str] | None = None
    """Settings a resume may change although they change the run's trajectory (`--resume-changed KEY`, e.g.
    optim.lr): each change is logged and recorded in the checkpoints and summary.json. Without it, a resume
    that changes such a setting stops (exit 2) before the model is built."""
    async_save: bool = True
    """Write checkpoints in a background thread: the loop stops only to copy the state into host memory (and
    for ZeRO-1's gather of the optimizer state), then trains on while the files are written. At most one write
    is in flight; the final save, a stop (SIGTERM/SIGINT) and the end of the run wait for it. false = write
    in the loop, as before (for comparison)."""
    on_error: Literal["stop", "continue"] = "stop"
    """What a failed background write (a full disk) does: stop = the run stops with the error at its next
    checkpoint (every rank together; the earlier checkpoints are intact); continue = it trains on and writes
    the next checkpoint as planned. Either way the failure is logged at once and listed in summary.json
    (`checkpoint_failures`). A failed final or stop save always ends the run with the error."""

    def _check(self) -> None:
        require(self.every >= 0, "every", f"must be >= 0 (0 = only at the end), got {self.every}")
        require(self.keep_last >= 1, "keep_last", f"must be >= 1, got {self.keep_last}")


@dataclass(kw_only=True)
class LoggingConfig(_Section):
    """Progress bar, per-step JSONL, TensorBoard, end-of-run summary and plots."""

    every: int = 50
    """Steps between host synchronisations (loss check, progress bar, log flush, a stop signal's agreement).
    Each one drains the device's queue: n1.6-3b on an H100 sat idle about 24 ms after each (metrics.jsonl's
    between_steps_s), 3.7% of its 64 ms steps at 10, 0.7% at 50 (a log line every ~3 s)."""
    progress: bool = True
    """Show a progress bar (main process only)."""
    tensorboard: bool = True
    """Write TensorBoard scalars when tensorboard is installed."""
    plots: bool = True
    """Write loss-curve and step-time PNGs at the end."""
    peak_tflops: float | None = None
    """Device peak for MFU, in TFLOP/s; None = the datasheet dense bf16 peak of a known GPU (H100/H200 989,
    A100/A800 312), as torchtitan and Megatron count MFU."""
    summary_skip: int = 5
    """Leading steps left out of the throughput summary (compilation, capture, warm caches)."""
    profile_steps: int = 0
    """Record this many steps after `summary_skip` with torch.profiler, on every rank: `kernels_rank<R>.json`
    (GPU kernel time per step by family, the costliest kernels) and `trace_rank<R>.json.gz` (a Chrome/Perfetto
    timeline: what overlaps what) in the output folder. They count in the summary; for diagnosis, not for
    throughput numbers."""

    def _check(self) -> None:
        require(self.every >= 1, "every", f"must be >= 1, got {self.every}")
        require(self.profile_steps >= 0, "profile_steps", f"must be >= 0, got {self.profile_steps}")
        require(self.peak_tflops is None or self.peak_tflops > 0, "peak_tflops", "must be > 0 or none")
        require(self.summary_skip >= 0, "summary_skip", f"must be >= 0, got {self.summary_skip}")


@dataclass(kw_only=True)
class EvalConfig(_Section):
    """Open-loop validation on the held-out episodes (data.val_episodes) while training."""

    every: int = 500
    """Validate every this many steps and after the last one; 0 = never. A validation predicts the action
    chunks of a fixed set of held-out samples and reports their MSE (per joint group and overall, on the
    normalized scale) next to predicting the training set's mean action, in metrics.jsonl, TensorBoard,
    loss.png and summary.json."""
    batches: int = 4
    """Batches of data.batch_size held-out samples per validation: a fixed, seeded choice of frames (fewer
    when the held-out episodes hold fewer)."""

    def _check(self) -> None:
        require(self.every >= 0, "every", f"must be >= 0 (0 = never), got {self.every}")
        require(self.batches >= 1, "batches", f"must be >= 1, got {self.batches}")


@dataclass(kw_only=True)
class MemoryConfig(_Section):
    """Techniques that trade speed for device memory, each its own switch."""

    recompute: list[str] = field(default_factory=list)
    """Trainable blocks whose activations are recomputed in the backward instead of kept (activation
    checkpointing): dit (the DiT's blocks), llm (the trainable language-model layers). The same numbers with less
    memory, at the cost memory.recompute_policy says."""
    recompute_policy: Literal["auto", "full", "selective"] = "auto"
    """What a recomputed block keeps for its backward: full = only its inputs, the backward running its whole
    forward again (about one more forward of those blocks); selective = its inputs and the outputs of its GEMMs
    and attention, the backward recomputing only the cheap ops between them (norms, activations, elementwise
    products: no GEMM again, but less memory saved); auto = full, except that memory.budget_gib tries
    selective first. The same numbers either way."""
    budget_gib: float | None = None
    """Device memory per GPU the run must fit in, in GiB; None = no planning (the settings as given). With a
    budget the trainer predicts the peak of the model it will build and adds, cheapest first, the techniques
    that make it fit: recompute dit, 8-bit AdamW moments (where vla-overlap offers them), recompute llm (with
    memory.recompute_policy=auto: selectively, then fully recomputed), then smaller microbatches with
    optim.grad_accum keeping the effective batch. It logs its choice and the predicted peak per component
    before the first step, the measured peak after it, and stops (exit 2) when nothing fits. Settings you give
    (memory.recompute, a recompute_policy other than auto, memory.adam_moments, optim.grad_accum) are kept."""
    adam_moments: Literal["auto", "fp32", "int8"] = "auto"
    """AdamW's two moments in fp32, or block-wise quantized to 8 bits (ZeRO-1's DistributedAdamW, where the
    installed vla-overlap offers it); auto = fp32, or int8 where memory.budget_gib needs it."""

    def _check(self) -> None:
        allowed = ("dit", "llm")
        odd = [name for name in self.recompute if name not in allowed]
        require(not odd, "recompute", f"{odd} are not among the allowed values: {', '.join(allowed)}")
        budget = self.budget_gib
        require(budget is None or budget > 0, "budget_gib", f"must be > 0 GiB or none, got {budget}")


@dataclass(kw_only=True)
class TrainConfig(_Section):
    """Everything one training run needs."""

    steps: int = 10_000
    """Optimizer steps."""
    seed: int = 42
    """Seed of every random stream (model init, data order, augmentation, flow-matching noise)."""
    device: Literal["auto", "cpu", "cuda"] = "auto"
    """auto = CUDA when available (one GPU per process under torchrun), else CPU."""
    precision: Literal["auto", "bf16", "fp32"] = "auto"
    """Model precision: bf16 = frozen weights bf16, trainable fp32, bf16 autocast (the release's policy);
    fp32 = everything fp32; auto = bf16 on CUDA (and with optimizations.bf16_weights), the model preset's own
    choice on CPU."""
    output_dir: str = "runs/gr00t-train"
    """Where logs, plots, the resolved config and (by default) checkpoints go."""
    data: DataConfig = field(default_factory=DataConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    optimizations: OptimizationsConfig = field(default_factory=OptimizationsConfig)
    checkpoint: CheckpointConfig = field(default_factory=CheckpointConfig)
    logging: LoggingConfig = field(default_factory=LoggingConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)
    memory: MemoryConfig = field(default_factory=MemoryConfig)

    def _check(self) -> None:
        require(self.steps >= 1, "steps", f"must be >= 1, got {self.steps}")
        require(
            not (self.optimizations.bf16_weights == "on" and self.precision == "fp32"),
            "optimizations.bf16_weights",
            "needs bf16 autocast; it cannot run with precision=fp32",
        )
        require(
            not (self.optimizations.flat_optimizer == "on" and self.device == "cpu"),
            "optimizations.flat_optimizer",
            "is a Triton kernel: it needs device=cuda (or auto on a GPU host)",
        )
        require(bool(self.output_dir), "output_dir", "must not be empty")
        require(
            not (self.model.lora.rank and self.optimizations.merged_dit_linears == "on"),
            "optimizations.merged_dit_linears",
            "cannot be on with LoRA adapters (model.lora.rank > 0): an adapter belongs to one of q, k, v, and "
            "the merged form computes them in one GEMM; leave it auto",
        )
        profiled = self.logging.summary_skip + self.logging.profile_steps
        require(
            self.logging.profile_steps == 0 or profiled <= self.steps,
            "logging.profile_steps",
            f"records steps {self.logging.summary_skip + 1}-{profiled} (after logging.summary_skip), but the run "
            f"has {self.steps}",
        )

    @property
    def checkpoint_dir(self) -> str:
        """The checkpoint folder, resolved."""
        return self.checkpoint.dir or f"{self.output_dir}/checkpoints"
