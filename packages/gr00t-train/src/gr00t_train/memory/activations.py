"""The activation side of the memory budget: what a training forward keeps for the backward, per sample.

The model: each trainable block keeps a number of elements per sample proportional to its tokens x width
(DiT blocks: action tokens x DiT width, plus for a cross-attention block the keys and values of the VL
context, VL tokens x DiT width; trainable LLM layers: VLM tokens x LLM width), and the rest of the trainable
path keeps some more per sample (VLM tokens x LLM width). A recomputed block keeps only its inputs (policy
full) or its inputs and the outputs of its GEMMs and attention (policy selective), and its backward holds one
block's full activations again for a moment.

The constants (`SAVED_PER_UNIT`) are counted, not guessed: `count_saved_per_sample` runs a training forward
under `torch.autograd.graph.saved_tensors_hooks` and attributes every tensor autograd saves (each storage
once) to the block that saved it, at two batch sizes; the difference is one sample's. Under selective
recompute the outputs a block keeps are held by torch.utils.checkpoint's cache, not by autograd: a dispatch
mode counts the outputs of the ops the policy keeps (`GR00TN16.kept_by_selective_recompute`). The table holds that
count for the tiny preset with n1.6-3b's width ratios, eager, on a CPU. On a GPU the blocks are compiled and
attention runs in flash kernels, which keep less: `benchmarks/memory_budget.py` measures the ratio of what
the GPU keeps to this count and rewrites `calibration.json` (`CALIBRATION_FILE`) with it."""

from __future__ import annotations

import contextlib
import json
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.utils._pytree as pytree
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode

SAVED_PER_UNIT = {
    "dit_self": 17.3,
    "dit_cross_tokens": 17.3,
    "dit_cross_context": 3.0,
    "llm": 25.0,
    "rest_vlm": 9.7,
    "rest_action": 5.0,
    "recomputed_dit": 3.5,
    "recomputed_llm": 2.2,
    "selective_dit_self": 13.7,
    "selective_dit_cross_tokens": 11.6,
    "selective_dit_cross_context": 2.0,
    "selective_llm": 13.3,
}
"""Elements kept per sample per unit of (tokens x width): `dit_self` per self-attention DiT block and unit
(action tokens x DiT width); `dit_cross_tokens` the same for a cross-attention block, `dit_cross_context` its
context part per (VL tokens x DiT width); `llm` per trainable LLM layer and (VLM tokens x LLM width);
`rest_vlm` and `rest_action` the rest of the trainable path per (VLM tokens x LLM width) and per (action
tokens x DiT width), the DiT's dropout masks aside (counted exactly: one byte per element); `recomputed_*`
what a recomputed block keeps under the full policy (its inputs) per unit of its kind, `selective_*` under the
selective policy (its inputs, GEMM and attention outputs; per unit of the same kinds as `dit_self`,
`dit_cross_*` and `llm`). Source: `count_saved_per_sample` on the tiny preset
with llm_intermediate_size 192 (n1.6-3b's 3 x width), action_horizon 16 and 8, two cameras, eager fp32 on a
CPU, 2026-12-03 (elements of 4 bytes; selective_* the same way on torch 2.14, 2026-12-03);
tests/gr00t_train/test_memory_plan.py and test_memory_selective.py count again."""

CALIBRATION_FILE = Path(__file__).with_name("calibration.json")
"""What the GPU measurements say beside the CPU count: `gpu_factor`, what a CUDA run keeps (compiled blocks,
flash attention, bf16 autocast) over the eager count of `SAVED_PER_UNIT` in the same element size;
`cuda_workspace_gib`, allocated memory beside states and activations (cuBLAS workspaces, compiled kernels'
buffers, the frozen prefix's transient tensors); `source`, where they come from.
`benchmarks/memory_budget.py --write-calibration` fits both to its runs' measured peaks and rewrites the file."""


def calibration() -> dict:
    """The GPU calibration (CALIBRATION_FILE)."""
    return json.loads(CALIBRATION_FILE.read_text())


@dataclass(frozen=True)
class Shapes:
    """A sample's sizes as the activation model counts them."""

    action_tokens: int
    """DiT tokens (the state token and the action chunk)."""
    vlm_tokens: int
    """VLM tokens (text and image), also the DiT's cross-attention context."""
    dit_width: int
    llm_width: int
    dit_self_blocks: int
    dit_cross_blocks: int
    llm_layers: int
    """Trainable LLM layers."""


def shapes_of(model: nn.Module, num_images: int, vlm_tokens: int | None) -> Shapes:
    """The shapes of `model` (a GR00TN16) for samples with `num_images` images and `vlm_tokens` VLM tokens
    (None: gr00t_model's default count for the images)."""
    import gr00t_model

    config = model.config
    counts = gr00t_model.training_flops_per_sample(config, num_images=num_images, vlm_tokens=vlm_tokens)
    dit, llm = trainable_blocks(model)
    return Shapes(
        action_tokens=int(counts["dit_tokens"]),
        vlm_tokens=int(counts["vlm_tokens"]),
        dit_width=config.input_embedding_dim,
        llm_width=config.llm_hidden_size,
        dit_self_blocks=sum(1 for i, _ in dit if i % 2),
        dit_cross_blocks=sum(1 for i, _ in dit if not i % 2),
        llm_layers=len(llm),
    )


def trainable_blocks(model: nn.Module) -> tuple[list[tuple[int, nn.Module]], list[nn.Module]]:
    """(index, block) of the DiT blocks that train, and the LLM layers that train."""
    blocks = model.action_head.model.transformer_blocks
    dit = [(i, b) for i, b in enumerate(blocks) if any(p.requires_grad for p in b.parameters())]
    layers = model.backbone.language_model.layers
    return dit, [m for m in layers if any(p.requires_grad for p in m.parameters())]


def block_elements(shapes: Shapes, table: dict[str, float] = SAVED_PER_UNIT) -> dict[str, float]:
    """Elements one sample keeps in one block of each kind, and in the rest of the trainable path (the
    dropout masks aside: `mask_bytes`)."""
    action = shapes.action_tokens * shapes.dit_width
    vlm = shapes.vlm_tokens * shapes.llm_width
    return {
        "dit_self": table["dit_self"] * action,
        "dit_cross": table["dit_cross_tokens"] * action
        + table["dit_cross_context"] * shapes.vlm_tokens * shapes.dit_width,
        "llm": table["llm"] * vlm,
        "rest": table["rest_vlm"] * vlm + table["rest_action"] * action,
    }


def mask_bytes(shapes: Shapes, ff_mult: int, dropout: float) -> int:
    """The DiT's dropout keep-masks of one sample (bool, drawn once per step for every block)."""
    if not 0.0 < dropout < 1.0:
        return 0
    blocks = shapes.dit_self_blocks + shapes.dit_cross_blocks
    return (3 + ff_mult) * shapes.action_tokens * shapes.dit_width * blocks


def activation_bytes(
    shapes: Shapes,
    batch: int,
    recompute: tuple[str, ...],
    element_bytes: int,
    factor: float = 1.0,
    masks: int = 0,
    table: dict[str, float] = SAVED_PER_UNIT,
    policy: str = "full",
) -> int:
    """Bytes the forward of `batch` samples keeps for the backward (`masks`: `mask_bytes` of a sample), plus
    the backward's recomputation of one block where blocks are recomputed (`recompute`: dit, llm; `policy`:
    full or selective, memory.recompute_policy)."""
    if policy not in ("full", "selective"):
        raise ValueError(f"policy must be full or selective, got {policy!r}")
    per = block_elements(shapes, table)
    dit_kept = per["dit_self"] * shapes.dit_self_blocks + per["dit_cross"] * shapes.dit_cross_blocks
    llm_kept = per["llm"] * shapes.llm_layers
    transient = 0.0
    if "dit" in recompute:  # a checkpointed block keeps its inputs (and under selective its GEMMs' outputs)
        dit_blocks = shapes.dit_self_blocks + shapes.dit_cross_blocks
        dit_kept = dit_blocks * table["recomputed_dit"] * shapes.action_tokens * shapes.dit_width
        if policy == "selective":
            kept = block_elements(shapes, {k.removeprefix("selective_"): v for k, v in table.items()})
            dit_kept = kept["dit_self"] * shapes.dit_self_blocks + kept["dit_cross"] * shapes.dit_cross_blocks
        transient = max(transient, per["dit_cross"] if shapes.dit_cross_blocks else per["dit_self"])
    if "llm" in recompute and shapes.llm_layers:
        kind = "recomputed_llm" if policy == "full" else "selective_llm"
        llm_kept = shapes.llm_layers * table[kind] * shapes.vlm_tokens * shapes.llm_width
        transient = max(transient, per["llm"])
    elements = dit_kept + llm_kept + per["rest"] + transient
    return int(batch * (elements * element_bytes * factor + masks))


def count_saved_per_sample(
    model: nn.Module, loss_at: Callable[[int], torch.Tensor], batches: tuple[int, int] = (1, 2)
) -> dict[str, float]:
    """Bytes of distinct storages autograd saves for the backward of `loss_at(batch)` (a training forward of
    `model`), per sample: per block of each kind (dit_self, dit_cross, llm: the trainable blocks) and for the
    rest, from the difference between the two batch sizes (weights and anything else that does not grow with
    the batch cancel out). A storage is counted once, for the block that saved it first."""
    dit, llm = trainable_blocks(model)
    kinds = {id(b): ("dit_cross" if i % 2 == 0 else "dit_self") for i, b in dit}
    kinds.update({id(m): "llm" for m in llm})
    number = {"dit_self": sum(1 for i, _ in dit if i % 2), "dit_cross": sum(1 for i, _ in dit if not i % 2)}
    number["llm"] = len(llm)
    modules = [b for _, b in dit] + llm
    config = model.config
    cached = set()  # block kinds whose kept outputs torch.utils.checkpoint's cache holds (selective policy)
    if config.checkpoint_policy == "selective":
        cached = {k for k in number if ("dit" if k.startswith("dit") else "llm") in config.checkpoint_blocks}
    totals = [_saved_by_kind(modules, kinds, lambda b=batch: loss_at(b), cached) for batch in batches]
    (small, big), (low, high) = batches, totals
    per_sample = {k: (high[k] - low[k]) / (big - small) for k in low}
    return {k: v / number[k] if k in number and number[k] else v for k, v in per_sample.items()}


def _saved_by_kind(
    modules: list[nn.Module], kinds: dict[int, str], forward: Callable[[], object], cached: set[str]
) -> dict:
    """Bytes of the distinct storages `forward()` saves for the backward, by the kind of block saving them;
    in blocks of the `cached` kinds also the outputs selective checkpointing keeps."""
    from gr00t_model import GR00TN16

    current: list[str] = []
    seen: dict[int, tuple[str, int]] = {}

    def pack(tensor: torch.Tensor) -> torch.Tensor:
        storage = tensor.untyped_storage()
        seen.setdefault(storage.data_ptr(), (current[-1] if current else "rest", storage.nbytes()))
        return tensor

    class KeptOutputs(TorchDispatchMode):  # what the selective policy caches for the backward
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            if current and current[-1] in cached and GR00TN16.kept_by_selective_recompute(func):
                for t in pytree.tree_leaves(out):
                    if isinstance(t, torch.Tensor):
                        pack(t)
            return out

    hooks = [m.register_forward_pre_hook(lambda m, _: current.append(kinds[id(m)])) for m in modules]

    def leave(*_) -> None:  # a forward hook's return value would replace the block's output
        current.pop()

    hooks += [m.register_forward_hook(leave) for m in modules]
    try:
        modes = KeptOutputs() if cached else contextlib.nullcontext()
        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t), modes, warnings.catch_warnings():
            # newer torch warns that the cache bypasses these hooks: the dispatch mode counts it instead
            warnings.filterwarnings("ignore", "A saved_tensors_hooks context", FutureWarning)
            forward()
    finally:
        for hook in hooks:
            hook.remove()
    kept = dict.fromkeys(("dit_self", "dit_cross", "llm", "rest"), 0)
    for kind, nbytes in seen.values():
        kept[kind] += nbytes
    return kept
