"""LoRA: low-rank adapters on the model's trainable linears, saved alone, loaded onto a base, merged for export.

A targeted `nn.Linear` becomes a `LoRALinear` in place (the same module, its class swapped and two parameters
added), so the base weight keeps its name and a release checkpoint still loads into it:

    y = x W^T + b + (alpha / rank) * dropout(x) A^T B^T,    A: [rank, in], B: [out, rank]

B starts at zero, so a fresh adapter leaves the model's outputs unchanged; A starts as torch's Linear init. The
base weight and bias are frozen; what else trains is the caller's choice. The DiT's merged linears (one GEMM
for q, k and v) are refused as targets: an adapter belongs to one projection of the release's layout, so it
loads into the model whichever way it is built (build it with `merged_dit_linears=False` for LoRA).
"""

from __future__ import annotations

import fnmatch
import json
import math
from collections.abc import Iterable
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from ._merged_linear import MergedLinear

DIT = "action_head.model.transformer_blocks.*"
DEFAULT_LORA_TARGETS = (
    f"{DIT}.attn1.to_q", f"{DIT}.attn1.to_k", f"{DIT}.attn1.to_v", f"{DIT}.attn1.to_out.0",
    f"{DIT}.ff.net.0.proj", f"{DIT}.ff.net.2",
    "backbone.language_model.layers.*.self_attn.?_proj", "backbone.language_model.layers.*.mlp.*_proj",
)  # fmt: skip
"""The DiT's attention and feed-forward projections and the language model's (only where trainable)."""
ADAPTER_CONFIG, ADAPTER_WEIGHTS = "adapter_config.json", "adapter.safetensors"


class LoRALinear(nn.Linear):
    """An nn.Linear with a low-rank update (made by `add_lora`, never constructed directly)."""

    lora_rank: int
    lora_scale: float
    lora_dropout: float

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = super().forward(x)
        h = F.dropout(x, self.lora_dropout, self.training) if self.lora_dropout else x
        return out + F.linear(F.linear(h, self.lora_A), self.lora_B) * self.lora_scale


def add_lora(
    model: nn.Module,
    rank: int,
    alpha: float,
    dropout: float = 0.0,
    targets: Iterable[str] = DEFAULT_LORA_TARGETS,
    *,
    only: Iterable[str] | None = None,
) -> list[str]:
    """Give every trainable nn.Linear whose name matches a pattern of `targets` (fnmatch) an adapter (or,
    with `only`, exactly the named modules); returns their names. Refuses a model that has adapters."""
    if rank < 1 or alpha <= 0 or not 0 <= dropout < 1:
        raise ValueError(
            f"LoRA needs rank >= 1, alpha > 0 and dropout in [0, 1); got {rank}, {alpha}, {dropout}"
        )
    if lora_modules(model):
        raise ValueError("the model already has LoRA adapters (merge_lora or a fresh model first)")
    patterns = list(targets)
    names = list(only) if only is not None else _matching(model, patterns)
    if not names:
        raise ValueError(f"no trainable nn.Linear matches the LoRA targets {patterns}")
    for name in names:
        _attach(name, model.get_submodule(name), rank, alpha, dropout)
    model.lora_config = {
        "rank": rank,
        "alpha": alpha,
        "dropout": dropout,
        "targets": patterns,
        "modules": names,
    }
    return names


def _matching(model: nn.Module, patterns: list[str]) -> list[str]:
    def matches(name: str) -> bool:
        return any(fnmatch.fnmatchcase(name, p) for p in patterns)

    found = []
    for name, module in model.named_modules():
        if isinstance(module, MergedLinear):  # targeted when one of its parts is, under the part's name
            owner = name.rpartition(".")[0]
            parts = [f"{owner}.{part}" if owner else part for part, _ in module.parts]
            if any(matches(part) for part in parts):
                raise ValueError(
                    f"{name} is a merged linear ({', '.join(p for p, _ in module.parts)} in one GEMM): LoRA "
                    "adapts each projection; build the model with merged_dit_linears=False"
                )
        elif matches(name) and type(module) is nn.Linear and module.weight.requires_grad:
            found.append(name)
    return found


def _attach(name: str, linear: nn.Module, rank: int, alpha: float, dropout: float) -> None:
    if type(linear) is not nn.Linear:
        raise ValueError(
            f"{name} is a {type(linear).__name__}, not an nn.Linear: it cannot take a LoRA adapter"
        )
    weight, dtype = linear.weight, torch.float32  # adapters train in fp32 whatever the base's dtype
    a = torch.empty(rank, linear.in_features, device=weight.device, dtype=dtype)
    nn.init.kaiming_uniform_(a, a=math.sqrt(5))  # nn.Linear's own init
    linear.lora_A = nn.Parameter(a)
    linear.lora_B = nn.Parameter(torch.zeros(linear.out_features, rank, device=weight.device, dtype=dtype))
    linear.lora_rank, linear.lora_scale, linear.lora_dropout = rank, alpha / rank, dropout
    linear.weight.requires_grad_(False)
    if linear.bias is not None:
        linear.bias.requires_grad_(False)
    linear.__class__ = LoRALinear


def lora_modules(model: nn.Module) -> dict[str, LoRALinear]:
    """The model's adapted linears by name."""
    return {name: m for name, m in model.named_modules() if isinstance(m, LoRALinear)}


def lora_state_dict(model: nn.Module) -> dict[str, torch.Tensor]:
    """Only the adapters' tensors (`<module>.lora_A`, `<module>.lora_B`): a few MB where the model is GB."""
    return {
        f"{name}.{kind}": getattr(m, kind).detach()
        for name, m in lora_modules(model).items()
        for kind in ("lora_A", "lora_B")
    }


def save_lora(model: nn.Module, folder: str | Path) -> Path:
    """Write the adapters alone: adapter_config.json (rank, alpha, dropout, targets, module names) and
    adapter.safetensors (fp32)."""
    from safetensors.torch import save_file

    if not lora_modules(model):
        raise ValueError("the model has no LoRA adapters to save")
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    tensors = {k: v.float().contiguous().cpu() for k, v in lora_state_dict(model).items()}
    save_file(tensors, str(folder / ADAPTER_WEIGHTS))
    (folder / ADAPTER_CONFIG).write_text(json.dumps(model.lora_config, indent=2) + "\n")
    return folder


def load_lora(model: nn.Module, folder: str | Path) -> list[str]:
    """Put the adapters of `folder` (save_lora's) onto `model`, a model of the same layout built or loaded
    from the base they were trained on; returns the adapted module names."""
    from safetensors.torch import load_file

    folder = Path(folder)
    try:
        config = json.loads((folder / ADAPTER_CONFIG).read_text())
    except (OSError, ValueError) as err:
        raise ValueError(f"{folder}: not a LoRA adapter folder ({ADAPTER_CONFIG}: {err})") from err
    missing = [n for n in config["modules"] if not _has_module(model, n)]
    if missing:
        raise ValueError(f"{folder}: the model has no module {missing[0]} (adapters of another layout?)")
    names = add_lora(model, config["rank"], config["alpha"], config["dropout"], config["targets"],
                     only=config["modules"])  # fmt: skip
    saved = load_file(str(folder / ADAPTER_WEIGHTS))
    expected = set(lora_state_dict(model))
    if set(saved) != expected:
        odd = sorted(set(saved) ^ expected)
        raise ValueError(f"{folder / ADAPTER_WEIGHTS} does not match its config: {odd[:3]}")
    with torch.no_grad():
        for name, module in lora_modules(model).items():
            module.lora_A.copy_(saved[f"{name}.lora_A"])
            module.lora_B.copy_(saved[f"{name}.lora_B"])
    return names


def _has_module(model: nn.Module, name: str) -> bool:
    try:
        model.get_submodule(name)
    except AttributeError:
        return False
    return True


def merge_lora(model: nn.Module) -> int:
    """Fold every adapter into its base weight (W += scale * B A, computed in fp32) and remove it: the model
    is plain again, for export or inference. Returns how many were merged."""
    merged = lora_modules(model)
    with torch.no_grad():
        for module in merged.values():
            delta = (module.lora_B.float() @ module.lora_A.float()) * module.lora_scale
            module.weight.copy_((module.weight.float() + delta).to(module.weight.dtype))
            del module.lora_A, module.lora_B, module.lora_rank, module.lora_scale, module.lora_dropout
            module.__class__ = nn.Linear
    if hasattr(model, "lora_config"):
        del model.lora_config
    return len(merged)
