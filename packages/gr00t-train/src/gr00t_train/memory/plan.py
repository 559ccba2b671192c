"""Predicted device memory of a training run, per component, from the model's own parameters.

The states are exact: frozen weights (with the prepared copies of the frozen prefix's GEMM weights), trainable
weights, fp32 master weights (and remainders), AdamW moments and gradient buffers are laid out as vla-overlap
lays them out (`vla_overlap.plan_layout`: per-dtype buffers, aligned parameters, buckets padded to the world
size, ZeRO-1's shard of each bucket per rank). Activations come from `memory.activations` (a counted model of
what the trainable blocks keep per sample) and the workspace (cuBLAS, compiled kernels, graph pools, the
allocator's slack) from a measured constant (both GPU constants in calibration.json). The peak is their sum: the backward of the last microbatch holds
every state and the batch's activations at once."""

from __future__ import annotations

from dataclasses import dataclass, field
from types import SimpleNamespace

import torch
import vla_overlap
from torch import nn

from .._comm import _flat_kernel, _grad_buffer_dtype, bucket_elements
from ..config.sections import TrainConfig
from .activations import Shapes, activation_bytes, calibration, mask_bytes

COMPONENTS = (
    "frozen_weights", "trainable_weights", "masters", "moments", "gradients", "activations", "workspace",
)  # fmt: skip
GiB = 2**30
_PREPARED = ("prepared_weight", "prepared_bias", "fp8_weight", "fp8_scale")
"""Tensors gr00t-model's FrozenLinear holds beside its parameters (its GEMM-ready copies)."""


@dataclass
class Prediction:
    """Predicted bytes per component (COMPONENTS) of one rank."""

    parts: dict[str, int] = field(default_factory=dict)
    detail: dict[str, int] = field(default_factory=dict)
    """How the activations were counted: `eager_activations` (the CPU count's model, before the GPU
    factor) and `dropout_masks` (exact); what a calibration fits against (benchmarks/memory_budget.py)."""

    @property
    def total(self) -> int:
        return sum(self.parts.values())

    def gib(self) -> dict[str, float]:
        """Each component and the total, in GiB (rounded to 0.01)."""
        out = {name: round(self.parts[name] / GiB, 2) for name in COMPONENTS}
        return {**out, "total": round(self.total / GiB, 2)}


def moment_bytes_per_element(moments: str) -> float:
    """Bytes of both AdamW moments per stepped element: fp32, or int8 with one fp32 scale per block."""
    if moments not in vla_overlap.MOMENT_BYTES:  # "auto" must be resolved first (_comm.adam_moments)
        raise ValueError(f"moments must be one of {sorted(vla_overlap.MOMENT_BYTES)}, got {moments!r}")
    return vla_overlap.MOMENT_BYTES[moments]


def frozen_bytes(model: nn.Module) -> int:
    """Frozen parameters, buffers and FrozenLinear's prepared copies (each storage once)."""
    seen: dict[int, int] = {}

    def add(t: torch.Tensor | None) -> None:
        if t is not None:
            seen[_key(t)] = t.numel() * t.element_size()

    for p in model.parameters():
        if not p.requires_grad:
            add(p)
    for b in model.buffers():
        add(b)
    for m in model.modules():
        for name in _PREPARED:
            add(getattr(m, name, None))
    return sum(seen.values())


def _key(t: torch.Tensor) -> int:
    return id(t) if t.device.type == "meta" else t.untyped_storage().data_ptr()


def state_bytes(model: nn.Module, cfg: TrainConfig, world_size: int, device_type: str, moments: str) -> dict:
    """Weights, masters, moments and gradients of one rank, as `plan_grad_sync` builds them for `cfg` (a
    resolved config) at `world_size`. The moments are counted as allocated at the first optimizer step."""
    opts = cfg.optimizations
    trainable = [(name, p) for name, p in model.named_parameters() if p.requires_grad]
    env = SimpleNamespace(world_size=world_size, device=torch.device(device_type))
    frozen = frozen_bytes(model)
    if opts.comm == "ddp":  # torch DDP: own parameters and .grad, its fp32 buckets, torch AdamW
        numel = sum(p.numel() for _, p in trainable)
        weights = sum(p.numel() * p.element_size() for _, p in trainable)
        return {"frozen_weights": frozen, "trainable_weights": weights, "masters": 0,
                "moments": int(numel * moment_bytes_per_element(moments)), "gradients": 2 * weights}  # fmt: skip
    grad_dtype = _grad_buffer_dtype(cfg, env)
    layout = vla_overlap.plan_layout(
        [(name, p.dtype, p.numel()) for name, p in trainable],
        world_size=world_size,
        bucket_elements=bucket_elements(opts.bucket_mib, torch.float32),
        grad_dtype=grad_dtype,
    )
    grads = sum(b.numel * _size(b.grad_dtype) for b in layout.buffers)
    if opts.comm != "zero1_overlap":  # parameters stay where they are; torch AdamW on every element
        numel = sum(p.numel() for _, p in trainable)
        weights = sum(p.numel() * p.element_size() for _, p in trainable)
        return {"frozen_weights": frozen, "trainable_weights": weights, "masters": 0,
                "moments": int(numel * moment_bytes_per_element(moments)), "gradients": grads}  # fmt: skip
    flat = _flat_kernel(opts, env) is not None or moments == "int8"  # 8-bit moments: the flat step's own
    remainders = opts.param_remainders and opts.bf16_weights == "on" and flat
    weights = sum(b.numel * _size(b.param_dtype) for b in layout.buffers)
    masters, pieces = 0, [0] * world_size  # torch's AdamW: each rank's parameter pieces
    for bucket in layout.buckets:
        shard = bucket.numel // world_size
        buffer = layout.buffers[bucket.buffer]
        own = buffer.param_dtype in (torch.float32, torch.float64)
        masters += 0 if own else shard * 4
        if remainders and buffer.param_dtype == torch.bfloat16:
            masters += shard * 2
        if not flat and buffer.grad_dtype != torch.float32:  # the shard's gradient widened for torch's AdamW
            grads += shard * 4
        for rank in range(world_size if not flat else 0):
            pieces[rank] += sum(x.numel for x in layout.pieces(bucket.index, rank))
    # the flat step's moments span every whole shard; torch's AdamW holds them per parameter piece (the rank
    # holding the most counts: the budget is per GPU)
    moment_elements = sum(b.numel // world_size for b in layout.buckets) if flat else max(pieces)
    return {
        "frozen_weights": frozen,
        "trainable_weights": weights,
        "masters": masters,
        "moments": int(moment_elements * moment_bytes_per_element(moments)),
        "gradients": grads,
    }


def _size(dtype: torch.dtype) -> int:
    return torch.empty((), dtype=dtype).element_size()


def resolved_policy(cfg: TrainConfig) -> str:
    """memory.recompute_policy as the model runs it (auto: full; a budget chooses before)."""
    policy = cfg.memory.recompute_policy
    return "full" if policy == "auto" else policy


def predict(
    model: nn.Module,
    cfg: TrainConfig,
    *,
    world_size: int,
    device_type: str,
    shapes: Shapes,
    moments: str = "fp32",
) -> Prediction:
    """Every component of one rank's peak for a resolved `cfg` (data.batch_size is the microbatch;
    memory.recompute the recomputed blocks, memory.recompute_policy what they keep) on `model` as built
    for it."""
    parts = state_bytes(model, cfg, world_size, device_type, moments)
    cuda = device_type == "cuda"
    gpu = calibration() if cuda else {"gpu_factor": 1.0, "cuda_workspace_gib": 0.0}
    element = 2 if cfg.precision == "bf16" else 4
    config = model.config
    batch, recompute = cfg.data.batch_size, tuple(cfg.memory.recompute)
    policy = resolved_policy(cfg)
    masks = mask_bytes(shapes, config.dit_ff_mult, config.dit_dropout)
    parts["activations"] = activation_bytes(
        shapes, batch, recompute, element, factor=gpu["gpu_factor"], masks=masks, policy=policy
    )
    parts["workspace"] = int(gpu["cuda_workspace_gib"] * GiB)
    detail = {
        "eager_activations": activation_bytes(shapes, batch, recompute, element, policy=policy),
        "dropout_masks": batch * masks,
    }
    return Prediction({name: int(parts[name]) for name in COMPONENTS}, detail)
