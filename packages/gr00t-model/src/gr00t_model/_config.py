"""The model configuration: one dataclass for every size, from `tiny` to the released `n1.6-3b`."""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from typing import Any

DTYPES = ("float32", "bfloat16", "float16")
PRESETS = ("n1.6-3b", "n1.6-code-defaults", "tiny")
CHECKPOINTABLE = ("dit", "llm")
"""Block kinds GR00TConfig.checkpoint_blocks may name."""
CHECKPOINT_POLICIES = ("full", "selective")
"""What a recomputed block keeps (GR00TConfig.checkpoint_policy, `_checkpointing`)."""


@dataclass(kw_only=True)
class GR00TConfig:
    """Sizes and training policy of a GR00T N1.6 model (defaults: the released `n1.6-3b`)."""

    # --- SigLIP2 vision tower (the unused pooling head is never built) ---
    vision_hidden_size: int = 1152
    """Width of the vision transformer."""
    vision_intermediate_size: int = 4304
    """Hidden width of each vision MLP."""
    vision_num_layers: int = 27
    """Number of vision encoder layers."""
    vision_num_heads: int = 16
    """Attention heads per vision layer."""
    vision_patch_size: int = 14
    """Side of a square image patch in pixels."""
    vision_num_positions: int = 256
    """Learned position table size; a square grid (256 = 16x16) resized to each image's patch grid."""
    vision_layer_norm_eps: float = 1e-6
    """LayerNorm epsilon of the vision tower."""
    downsample_factor: int = 2
    """Pixel-unshuffle factor of the connector: one LLM token per (factor*patch)^2 pixels."""

    # --- Qwen3 language model, truncated (no LM head) ---
    llm_hidden_size: int = 2048
    """Width of the language model; also the width of the VL features the DiT attends to."""
    llm_intermediate_size: int = 6144
    """Hidden width of each SwiGLU MLP."""
    llm_num_layers: int = 16
    """Decoder layers kept (the release keeps the first 16 of Qwen3-1.7B's 28)."""
    llm_num_heads: int = 16
    """Query heads."""
    llm_num_kv_heads: int = 8
    """Key/value heads (grouped-query attention)."""
    llm_head_dim: int = 128
    """Width of one attention head."""
    llm_rms_norm_eps: float = 1e-6
    """RMSNorm epsilon."""
    llm_rope_theta: float = 1_000_000.0
    """RoPE base frequency."""
    vocab_size: int = 151_680
    """Rows of the token embedding table."""
    image_token_id: int = 151_669
    """Token id of `<IMG_CONTEXT>`; its positions receive the image features."""

    # --- action head ---
    input_embedding_dim: int = 1536
    """Token width inside the DiT (= dit_num_heads * dit_head_dim)."""
    hidden_size: int = 1024
    """DiT output width and state-encoder / action-decoder hidden width."""
    max_state_dim: int = 128
    """State vectors are padded to this width."""
    max_action_dim: int = 128
    """Action vectors are padded to this width."""
    action_horizon: int = 50
    """Action chunk length the model predicts."""
    max_num_embodiments: int = 32
    """Slots of the per-embodiment encoders and decoder."""
    max_seq_len: int = 1024
    """Rows of the learned action position embedding."""
    dit_num_layers: int = 32
    """DiT blocks (odd: self-attention; even: cross-attention, alternating text and image)."""
    dit_num_heads: int = 32
    """DiT attention heads."""
    dit_head_dim: int = 48
    """DiT head width."""
    dit_dropout: float = 0.2
    """Dropout of DiT attention outputs and feed-forwards."""
    dit_ff_mult: int = 4
    """DiT feed-forward expansion."""
    attend_text_every_n_blocks: int = 2
    """Cross blocks alternate: block i attends to text when i % (2n) == 0, else to image tokens."""
    timestep_channels: int = 256
    """Sinusoid width fed to the DiT timestep MLP."""
    state_dropout_prob: float = 0.0
    """Probability of replacing a sample's state token by a learned mask token (training only)."""

    # --- flow matching ---
    noise_beta_alpha: float = 1.5
    """u ~ Beta(alpha, beta); t = noise_s * (1 - u)."""
    noise_beta_beta: float = 1.0
    """See noise_beta_alpha."""
    noise_s: float = 0.999
    """Upper bound of the sampled flow time t."""
    num_timestep_buckets: int = 1000
    """The time condition is floor(t * buckets)."""
    num_inference_timesteps: int = 4
    """Euler steps of action inference."""

    # --- what trains, and in which precision ---
    tune_llm: bool = False
    """Train the whole language model (embeddings and all kept layers)."""
    tune_visual: bool = False
    """Train the vision tower and the connector."""
    tune_top_llm_layers: int = 4
    """Train the last N kept LLM layers even when tune_llm is False."""
    tune_projector: bool = True
    """Train the state encoder, action encoder, action decoder and position embedding."""
    tune_diffusion_model: bool = True
    """Train the DiT."""
    tune_vlln: bool = True
    """Train the LayerNorm on the VL features."""
    frozen_dtype: str = "bfloat16"
    """Storage dtype of frozen parameters."""
    trainable_dtype: str = "float32"
    """Storage dtype of trainable parameters. With autocast (compute_dtype bf16/fp16) only the matmul weights
    take it (`GR00TN16.matmul_weights()`: autocast rounds them to 16 bits before use anyway, so the forward
    computes exactly what it computes from fp32 weights); norms, embeddings and bias adds stay float32."""
    compute_dtype: str | None = "bfloat16"
    """Autocast dtype of the forward pass; None runs without autocast."""
    grouped_embodiment_gemms: bool = False
    """Compute each per-embodiment projection as one grouped GEMM over the batch sorted by slot
    (torch._grouped_mm: on CPU, and on CUDA in bf16 on Hopper; elsewhere the release's form runs) instead of
    the release's per-sample gather of its slot's matrix and a batched matmul. The same products; a slot's
    weight gradient sums its samples in one GEMM's fp32 accumulation instead of per sample, so the tables count
    as matmul weights and take trainable_dtype like Linear weights."""

    merged_dit_linears: bool = False
    """The DiT's linears that read one input as one GEMM each: every block's AdaLN projection with proj_out_1
    (all read silu(temb)), and each self-attention block's q, k and v (`_merged_linear`). The same products;
    state dicts and checkpoints keep the release's names. Faster where small GEMMs leave the GPU idle
    (BENCHMARKS.md, levers tried)."""

    triton_attention: bool = False
    """On CUDA, the DiT's self- and cross-attention through our Triton flash kernels (`_attention`) instead of
    SDPA's: the same math, with the scores' softmax in fp32 and the probabilities rounded to 16 bits before
    they multiply the values, as flash kernels do. Faster at the DiT's 51 queries (BENCHMARKS.md, twelfth
    pass); elsewhere SDPA runs."""

    checkpoint_blocks: tuple[str, ...] = ()
    """Trainable blocks whose activations are recomputed in the backward instead of kept (`_checkpointing`):
    "dit" (the DiT's blocks), "llm" (the trainable language-model layers). The same numbers with less memory,
    for about one more forward of those blocks."""
    checkpoint_policy: str = "full"
    """What a recomputed block keeps (`_checkpointing`): "full" only its inputs, the backward running its whole
    forward again; "selective" also the outputs of its GEMMs and attention, the backward recomputing only the
    cheap ops between them (norms, activations, elementwise products)."""

    # --- default input geometry (processor and FLOP counter) ---
    image_size: tuple[int, int] = (252, 252)
    """(height, width) of every image fed to the vision tower; multiples of patch * downsample."""
    name: str = field(default="custom", compare=False)
    """Label only (the preset it came from)."""

    def __post_init__(self) -> None:
        self.image_size = tuple(int(s) for s in self.image_size)  # JSON gives lists
        self.checkpoint_blocks = tuple(self.checkpoint_blocks)
        unknown = sorted(set(self.checkpoint_blocks) - set(CHECKPOINTABLE))
        if unknown:
            raise ValueError(f"GR00TConfig.checkpoint_blocks: {unknown} are not among {CHECKPOINTABLE}")
        if self.checkpoint_policy not in CHECKPOINT_POLICIES:
            raise ValueError(
                f"GR00TConfig.checkpoint_policy must be one of {CHECKPOINT_POLICIES}, got {self.checkpoint_policy!r}"
            )
        exempt = ("tune_top_llm_layers", "image_token_id")  # may be 0; checked below
        positive = [f.name for f in dataclasses.fields(self) if f.type == "int" and f.name not in exempt]
        for name in positive:
            if getattr(self, name) <= 0:
                raise ValueError(f"GR00TConfig.{name} must be > 0, got {getattr(self, name)}")
        _divisible(self, "vision_hidden_size", "vision_num_heads")
        _divisible(self, "llm_num_heads", "llm_num_kv_heads")
        grid = math.isqrt(self.vision_num_positions)
        if grid * grid != self.vision_num_positions:
            raise ValueError(
                f"GR00TConfig.vision_num_positions must be a perfect square, got {self.vision_num_positions}"
            )
        if self.input_embedding_dim != self.dit_num_heads * self.dit_head_dim:
            raise ValueError(
                f"GR00TConfig.input_embedding_dim ({self.input_embedding_dim}) must equal "
                f"dit_num_heads * dit_head_dim ({self.dit_num_heads} * {self.dit_head_dim})"
            )
        if self.dit_num_layers < 2:
            raise ValueError(f"GR00TConfig.dit_num_layers must be >= 2, got {self.dit_num_layers}")
        if not 0 <= self.tune_top_llm_layers <= self.llm_num_layers:
            raise ValueError(
                f"GR00TConfig.tune_top_llm_layers must be in [0, llm_num_layers={self.llm_num_layers}], "
                f"got {self.tune_top_llm_layers}"
            )
        if self.action_horizon > self.max_seq_len:
            raise ValueError(
                f"GR00TConfig.action_horizon ({self.action_horizon}) must be <= max_seq_len ({self.max_seq_len})"
            )
        for name in ("dit_dropout", "state_dropout_prob"):
            if not 0.0 <= getattr(self, name) < 1.0:
                raise ValueError(f"GR00TConfig.{name} must be in [0, 1), got {getattr(self, name)}")
        if not 0.0 < self.noise_s <= 1.0:
            raise ValueError(f"GR00TConfig.noise_s must be in (0, 1], got {self.noise_s}")
        if self.noise_beta_alpha <= 0 or self.noise_beta_beta <= 0:
            raise ValueError("GR00TConfig.noise_beta_alpha and noise_beta_beta must be > 0")
        for name in ("frozen_dtype", "trainable_dtype"):
            if getattr(self, name) not in DTYPES:
                raise ValueError(f"GR00TConfig.{name} must be one of {DTYPES}, got {getattr(self, name)!r}")
        if self.compute_dtype not in (*DTYPES, None):
            raise ValueError(
                f"GR00TConfig.compute_dtype must be one of {DTYPES} or None, got {self.compute_dtype!r}"
            )
        if self.compute_dtype in (None, "float32") and self.frozen_dtype != self.trainable_dtype:
            raise ValueError(
                "GR00TConfig.frozen_dtype and trainable_dtype must match when compute_dtype is None/float32 "
                f"(no autocast to reconcile them), got {self.frozen_dtype!r} and {self.trainable_dtype!r}"
            )
        unit = self.vision_patch_size * self.downsample_factor
        if len(self.image_size) != 2 or any(s <= 0 or s % unit for s in self.image_size):
            raise ValueError(
                f"GR00TConfig.image_size must be (height, width), multiples of {unit}, got {self.image_size}"
            )
        if not 0 <= self.image_token_id < self.vocab_size:
            raise ValueError(
                f"GR00TConfig.image_token_id ({self.image_token_id}) must be < vocab_size ({self.vocab_size})"
            )

    @property
    def image_tokens_per_image(self) -> int:
        """LLM tokens one image of `image_size` becomes (one per (patch * downsample)^2 pixels)."""
        unit = self.vision_patch_size * self.downsample_factor
        return (self.image_size[0] // unit) * (self.image_size[1] // unit)

    @classmethod
    def preset(cls, name: str, **overrides: Any) -> GR00TConfig:
        """A named configuration (`n1.6-3b`, `n1.6-code-defaults`, `tiny`), optionally with fields overridden."""
        if name not in PRESETS:
            raise ValueError(f"unknown preset {name!r}; choose one of {PRESETS}")
        fields = dict(_PRESET_FIELDS[name], name=name)
        fields.update(overrides)
        return cls(**fields)

    def replace(self, **changes: Any) -> GR00TConfig:
        """A copy with some fields changed (validated again)."""
        return dataclasses.replace(self, **changes)

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON-ready dict of every field."""
        out = dataclasses.asdict(self)
        out["image_size"] = list(self.image_size)
        out["checkpoint_blocks"] = list(self.checkpoint_blocks)
        return out

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> GR00TConfig:
        """Inverse of to_dict; unknown keys are an error naming them."""
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise ValueError(f"GR00TConfig got unknown fields {unknown}")
        return cls(**data)


def _divisible(config: GR00TConfig, big: str, small: str) -> None:
    if getattr(config, big) % getattr(config, small):
        raise ValueError(
            f"GR00TConfig.{big} ({getattr(config, big)}) must be divisible by {small} ({getattr(config, small)})"
        )


# The bundled tiny tokenizer's vocabulary size and `<IMG_CONTEXT>` id (see _tokenizer.py).
TINY_VOCAB_SIZE = 1024
TINY_IMAGE_TOKEN_ID = 3

_PRESET_FIELDS: dict[str, dict[str, Any]] = {
    "n1.6-3b": {},
    "n1.6-code-defaults": {"action_horizon": 16, "max_state_dim": 29, "max_action_dim": 29},
    "tiny": {
        "vision_hidden_size": 48,
        "vision_intermediate_size": 96,
        "vision_num_layers": 2,
        "vision_num_heads": 3,
        "vision_num_positions": 16,
        "llm_hidden_size": 64,
        "llm_intermediate_size": 128,
        "llm_num_layers": 2,
        "llm_num_heads": 4,
        "llm_num_kv_heads": 2,
        "llm_head_dim": 16,
        "vocab_size": TINY_VOCAB_SIZE,
        "image_token_id": TINY_IMAGE_TOKEN_ID,
        "input_embedding_dim": 64,
        "hidden_size": 64,
        "max_state_dim": 64,
        "max_action_dim": 64,
        "action_horizon": 16,
        "max_seq_len": 64,
        "dit_num_layers": 4,
        "dit_num_heads": 4,
        "dit_head_dim": 16,
        "timestep_channels": 32,
        "tune_top_llm_layers": 1,
        "image_size": (56, 56),
        # Full fp32: CPUs without bf16 instructions (where tiny runs) are far slower in bf16.
        "frozen_dtype": "float32",
        "compute_dtype": None,
    },
}
