"""The model side of a run, from gr00t_model: build or load the model, its loss, the random draws kept
outside graphs, checkpoint saving/loading, and the analytic FLOPs for MFU."""

from __future__ import annotations

import json
import logging
import weakref
from collections.abc import Callable
from pathlib import Path

import gr00t_model
import torch
from gr00t_model import GR00TN16, GR00TConfig

from .._errors import ConfigError
from ..checkpoint.restore import BaseError, load_pretrained
from ..checkpoint.weights import BaseWeights
from ..config.optimizations import resolve_optimizations
from ..config.sections import TrainConfig
from ..metrics.startup import clock as startup_clock

log = logging.getLogger(__name__)
_BASES: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
"""What build_model loaded each model from (`base_weights`)."""

_PRECISION = {
    "bf16": {"compute_dtype": "bfloat16", "frozen_dtype": "bfloat16", "trainable_dtype": "float32"},
    "fp32": {"compute_dtype": None, "frozen_dtype": "float32", "trainable_dtype": "float32"},
}


def model_overrides(cfg: TrainConfig, device: torch.device, tokenizer) -> dict:
    """GR00TConfig fields the training config changes (its `auto` switches as they resolve on `device`)."""
    cfg, _ = resolve_optimizations(cfg, device)
    m = cfg.model
    fields = {
        k: getattr(m, k)
        for k in ("action_horizon", "tune_llm", "tune_visual", "tune_top_llm_layers")
        if getattr(m, k) is not None
    }
    precision = cfg.precision
    if precision == "auto":  # CPU: the preset's own choice, unless bf16 weights need autocast
        precision = "bf16" if device.type == "cuda" or cfg.optimizations.bf16_weights == "on" else None
    if precision is not None:
        fields.update(_PRECISION[precision])
    if cfg.optimizations.bf16_weights == "on":
        fields["trainable_dtype"] = "bfloat16"  # matmul weights only; the optimizer keeps fp32 masters
    grouped = cfg.optimizations.grouped_embodiment_gemms
    fields["grouped_embodiment_gemms"] = grouped == "on" or (grouped == "auto" and device.type == "cuda")
    fields["merged_dit_linears"] = merges_dit_linears(cfg, device.type)
    fields["checkpoint_blocks"] = tuple(cfg.memory.recompute)
    fields["checkpoint_policy"] = (
        "full" if cfg.memory.recompute_policy == "auto" else cfg.memory.recompute_policy
    )
    fields["triton_attention"] = _triton_attention(cfg, device)
    token_id = tokenizer.convert_tokens_to_ids("<IMG_CONTEXT>")
    fields["image_token_id"] = token_id
    return fields


def _triton_attention(resolved: TrainConfig, device: torch.device) -> bool:
    attention = resolved.optimizations.triton_attention
    return attention == "on" or (attention == "auto" and device.type == "cuda")


def merges_dit_linears(cfg: TrainConfig, device_type: str) -> bool:
    """Whether the model runs the DiT's merged linears (optimizations.merged_dit_linears, auto = on with
    CUDA). It changes the trainable parameters' layout, so the optimizer state of one form fits only it."""
    merged = cfg.optimizations.merged_dit_linears
    return merged == "on" or (merged == "auto" and device_type == "cuda" and not cfg.model.lora.rank)


LARGE_MODEL = 500_000_000
"""Parameters from which random initial weights or the bundled test tokenizer are worth a warning."""
RELEASE_HINT = (
    "To fine-tune the released GR00T-N1.6-3B, download it (`hf download nvidia/GR00T-N1.6-3B --local-dir "
    "DIR`) and pass --set model.checkpoint=DIR --set model.tokenizer=TOKENIZER_DIR (README: fine-tuning the "
    "release)"
)


def tokenizer_path(cfg: TrainConfig) -> str | None:
    """The tokenizer the run uses: model.tokenizer; else, when model.checkpoint is one of our training
    checkpoints, the one that checkpoint's run used (None = gr00t_model's bundled tokenizer)."""
    if cfg.model.tokenizer is not None or not cfg.model.checkpoint:
        return cfg.model.tokenizer
    recorded = Path(cfg.model.checkpoint) / "train_config.json"
    if not recorded.is_file():
        return None
    try:
        return json.loads(recorded.read_text()).get("model", {}).get("tokenizer")
    except (OSError, ValueError, AttributeError):
        return None


def start_facts(cfg: TrainConfig) -> dict:
    """Where the run starts (initial weights, tokenizer) for summary.json, warning (before the model is built)
    when a large preset starts from random weights or with the bundled byte-level test tokenizer."""
    tokenizer = tokenizer_path(cfg)
    warnings = []
    try:
        large = gr00t_model.count_parameters(GR00TConfig.preset(cfg.model.preset))["total"] >= LARGE_MODEL
    except (ValueError, KeyError):
        large = False  # an unknown preset is refused when the model is built
    if large and not cfg.model.checkpoint:
        warnings.append(
            f"model.checkpoint is not set: {cfg.model.preset} trains from random weights, not from the "
            f"release. {RELEASE_HINT}"
        )
    if large and tokenizer is None:
        warnings.append(
            "model.tokenizer is not set: the bundled byte-level tokenizer (made for tests and the demo) "
            "encodes the prompts, not the Qwen3 tokenizer the released weights were trained with. "
            "Pass --set model.tokenizer=TOKENIZER_DIR"
        )
    for line in warnings:
        log.warning("%s", line)
    return {
        "initial_weights": cfg.model.checkpoint or "random",
        "tokenizer": tokenizer or "bundled byte-level BPE (tests and demos)",
        "warnings": warnings,
    }


def import_model_modules(cfg: TrainConfig, device: torch.device) -> None:
    """Import the Python modules building the model needs beyond those imported already (the Triton attention
    op when it runs): start-up's "imports" part of the model phase."""
    resolved, _ = resolve_optimizations(cfg, device)
    GR00TN16.import_dependencies(triton_attention=_triton_attention(resolved, device))


def build_model(cfg: TrainConfig, device: torch.device, tokenizer) -> GR00TN16:
    """A fresh model of `model.preset` (same weights on every rank: seeded), or `model.checkpoint` loaded.
    Start-up parts of the model phase (metrics.startup.MODEL_PARTS): device, weights, adapters, frozen_prefix,
    device_sync."""
    if (
        cfg.optimizations.fp8_frozen
        and device.type == "cuda"
        and torch.cuda.get_device_capability(device) < (8, 9)
    ):
        raise ConfigError(
            "optimizations.fp8_frozen",
            f"FP8 GEMMs need compute capability 8.9 or newer (Ada, Hopper); "
            f"{torch.cuda.get_device_name(device)} has {torch.cuda.get_device_capability(device)}",
        )
    overrides = model_overrides(cfg, device, tokenizer)
    if cfg.model.checkpoint:
        model, provided = _load_checkpoint(cfg, device, overrides)
    else:
        model, provided = _random_model(cfg, device, tokenizer, overrides), None
    startup_clock.part("weights")
    if cfg.model.lora.rank:
        model = add_adapters(cfg, model)
        startup_clock.part("adapters")
    model = _prepare_frozen(cfg, model, device)
    startup_clock.part("frozen_prefix")
    if device.type == "cuda":  # the build's queued kernels, counted here rather than in a later phase
        torch.cuda.synchronize(device)
        startup_clock.part("device_sync")
    if provided is not None:
        _BASES[model] = BaseWeights(Path(cfg.model.checkpoint), provided)
    return model


def _random_model(cfg: TrainConfig, device: torch.device, tokenizer, overrides: dict) -> GR00TN16:
    try:
        config = GR00TConfig.preset(cfg.model.preset, **overrides)
    except ValueError as err:
        raise ConfigError("model.preset", str(err)) from err
    if len(tokenizer) > config.vocab_size:
        raise ConfigError(
            "model.tokenizer",
            f"the tokenizer has {len(tokenizer)} tokens, the model's vocab_size is {config.vocab_size}",
        )
    _start_device(device)
    torch.manual_seed(cfg.seed)  # identical initial weights on every rank
    with torch.device(device):
        model = GR00TN16(config)
    return model.train()


def _load_checkpoint(cfg: TrainConfig, device: torch.device, overrides: dict) -> tuple[GR00TN16, frozenset]:
    """`model.checkpoint` loaded, and the state-dict keys it provided."""
    if tokenizer_path(cfg) is None and not (Path(cfg.model.checkpoint) / "train_config.json").is_file():
        raise ConfigError(
            "model.tokenizer",
            "starting from model.checkpoint needs the tokenizer those weights were trained with "
            "(a local Hugging Face tokenizer directory, e.g. the release's Qwen3 tokenizer)",
        )
    _start_device(device)
    try:  # a release, a save_pretrained folder or one of our checkpoints (its base resolved)
        model, report = load_pretrained(cfg.model.checkpoint, device=device, **overrides)
    except BaseError as err:
        raise ConfigError("model.checkpoint", str(err)) from None
    if getattr(model, "lora_config", None) is not None:
        raise ConfigError(
            "model.checkpoint",
            f"{cfg.model.checkpoint} holds LoRA adapters: `gr00t-train export` it (the export merges them "
            "into the weights) and start from the export",
        )
    return model, frozenset(model.state_dict()) - set(report.missing)  # the adapters' tensors are not


def _start_device(device: torch.device) -> None:
    """On CUDA, the device's context created now (its first allocation and kernel), so start-up's "device"
    part shows what that costs apart from making the weights."""
    if device.type == "cuda":
        torch.zeros(1, device=device)
        torch.cuda.synchronize(device)
        startup_clock.part("device")


def add_adapters(cfg: TrainConfig, model: GR00TN16) -> GR00TN16:
    """With model.lora.rank > 0: LoRA adapters on the targeted trainable linears (seeded: the same on every
    rank), then everything frozen but the adapters and model.lora.train_in_full. The frozen weights keep the
    dtype the release's policy gave them, so a checkpoint's model rebuilds as it trained."""
    lora = cfg.model.lora
    if not lora.rank:
        return model
    targets = lora.targets if lora.targets is not None else gr00t_model.DEFAULT_LORA_TARGETS
    known = dict(model.named_modules())
    missing = [name for name in lora.train_in_full if name not in known]
    if missing:
        raise ConfigError("model.lora.train_in_full", f"the model has no module {missing[0]}")
    torch.manual_seed(cfg.seed + 1)  # the adapters' init: identical on every rank, apart from the model's
    try:
        names = gr00t_model.add_lora(model, lora.rank, lora.alpha or 2.0 * lora.rank, lora.dropout, targets)
    except ValueError as err:
        raise ConfigError("model.lora.targets", str(err)) from None
    full = {id(p) for name in lora.train_in_full for p in known[name].parameters()}
    for name, param in model.named_parameters():
        param.requires_grad_(name.endswith((".lora_A", ".lora_B")) or id(param) in full)
    trained = sum(p.numel() for p in model.parameters() if p.requires_grad)
    log.info(
        "LoRA: rank %d adapters on %d linears; %.1f M parameters train (adapters and %s), the rest is frozen",
        lora.rank, len(names), trained / 1e6, ", ".join(lora.train_in_full) or "nothing else",
    )  # fmt: skip
    return model


def base_weights(model: GR00TN16) -> BaseWeights | None:
    """The folder `build_model` loaded `model` from and the state-dict keys it provided (None: random weights):
    checkpoints record it rather than write those frozen tensors again."""
    return _BASES.get(model)


def _prepare_frozen(cfg: TrainConfig, model: GR00TN16, device: torch.device) -> GR00TN16:
    """On CUDA, the frozen SigLIP2 MLPs padded to a GEMM-friendly width (the same result) with their GELU in
    the GEMM's epilogue, and their q/k/v projections in one GEMM; with optimizations.fp8_frozen, the frozen prefix's linear layers in FP8
    (GR00TN16.prepare_frozen_prefix)."""
    fp8 = cfg.optimizations.fp8_frozen
    if device.type != "cuda" and not fp8:
        return model
    done = model.prepare_frozen_prefix(fp8=fp8)
    if fp8 and done["fp8_linears"] == 0:
        raise ConfigError(
            "optimizations.fp8_frozen",
            "the vision tower or connector trains (model.tune_visual), so no frozen prefix runs without "
            "gradients; FP8 GEMMs have no backward",
        )
    log.info(
        "frozen prefix: %d SigLIP2 MLPs padded, %d with GELU in the GEMM, %d attentions with one q/k/v GEMM, "
        "%d linear layers in FP8",
        done["padded_mlps"],
        done["gelu_in_gemm"],
        done["merged_qkv"],
        done["fp8_linears"],
    )
    return model


def embodiment_tables(model: GR00TN16) -> list[torch.nn.Parameter]:
    """The per-embodiment projections' weights and biases ([slots, ...]: a sample uses its slot's row)."""
    return [p for layer in model.action_head.embodiment_layers() for p in (layer.W, layer.b)]


def gr00t_loss(module: torch.nn.Module, batch: dict, prefix=None) -> torch.Tensor:
    """Flow-matching loss of one microbatch; noise and flow time come pre-drawn in the batch; `prefix` is
    the batch's frozen prefix when it was computed ahead (`GR00TN16.frozen_prefix`)."""
    return module(batch, noise=batch["noise"], t=batch["t"], prefix=prefix)["loss"]


def make_draw(model: GR00TN16, batch_size: int, device: torch.device) -> Callable[[dict], dict]:
    """Noise and flow time for one microbatch, drawn eagerly from the default generators (which the
    checkpoints save), so graphed and eager runs consume the same random stream."""
    c = model.config
    head = model.action_head

    def draw(batch: dict) -> dict[str, torch.Tensor]:
        noise = torch.randn(batch_size, c.action_horizon, c.max_action_dim, device=device)
        return {"noise": noise, "t": head.sample_time(batch_size, device)}

    return draw


def save_model(module: torch.nn.Module, folder: Path) -> None:
    """gr00t_model's own layout: `gr00t_model.from_pretrained(folder)` loads it bit-exactly."""
    gr00t_model.save_pretrained(module, folder)


def load_model_in_place(module: torch.nn.Module, folder: Path) -> None:
    """Load a save_pretrained checkpoint into an existing model through `load_state_dict`, which copies
    in place (captured graphs and communication buffers keep pointing at the same parameters, and
    vla_overlap refreshes its master weights)."""
    from safetensors.torch import load_file

    files = sorted(Path(folder).glob("*.safetensors"))
    if not files:
        raise FileNotFoundError(f"{folder}: no model safetensors to resume from")
    state: dict[str, torch.Tensor] = {}
    for file in files:
        state.update(load_file(str(file)))
    module.load_state_dict(state, strict=True)


def flops_and_tokens(config: GR00TConfig, num_images: int, vlm_tokens: int | None) -> tuple[float, float]:
    """Analytic training FLOPs per sample and tokens per sample (VLM + DiT)."""
    flops = gr00t_model.training_flops_per_sample(config, num_images=num_images, vlm_tokens=vlm_tokens)
    return flops["train"], flops["vlm_tokens"] + flops["dit_tokens"]
