"""Measured variants of step_variants.py's `ours-full` row: each undoes or changes one thing, so that its
effect is measured side by side in one process (BENCHMARKS.md, "Levers tried", lists what each measured)."""

from __future__ import annotations

import functools
from unittest import mock

import torch

PATCHES = {  # measured variants of a row, applied to the built Trainer
    # the optimizer's side stream at a higher priority
    "ours-full-high-priority": lambda t: setattr(t.updates, "_stream", torch.cuda.Stream(priority=-1)),
    # the clipping norm summed per parameter piece (torch's order) instead of per bucket shard
    "ours-full-piece-norm": lambda t: setattr(t.model.optimizer, "_shards_are_pieces", False),
    # the flat step's blocks exactly on the runs, 4-byte accesses (before 2026-12-01)
    "ours-full-unaligned": lambda t: _unaligned_blocks(t.model.optimizer.flat),
    # the clipping norm by torch's vector_norm per shard (before 2026-12-01)
    "ours-full-torch-norm": lambda t: setattr(
        t.model.optimizer.flat, "grad_norm", _torch_norm(t.model.optimizer.flat)
    ),
}

BUILT_WITH = {  # variants in place while the Trainer is built and runs
    # Inductor autotunes each block's GEMMs (Triton templates against cuBLAS) and its pointwise/reduction
    # kernels (coordinate descent), as mode="max-autotune-no-cudagraphs" does
    "ours-full-max-autotune": lambda: mock.patch.object(
        torch, "compile", _with_options(max_autotune=True, coordinate_descent_tuning=True)
    ),
    # Inductor tunes its pointwise and reduction kernels' launch configs (coordinate descent), no GEMM autotuning
    "ours-full-coordinate-descent": lambda: mock.patch.object(
        torch, "compile", _with_options(coordinate_descent_tuning=True)
    ),
    # coordinate descent for the frozen vision blocks only: their forward-only kernels are few, so tuning them
    # should cost seconds, where tuning every block's forward and backward cost 100 s (2026-12-01)
    "ours-full-cd-vision": lambda: mock.patch.object(
        torch, "compile", _with_options(blocks=("VisionLayer",), coordinate_descent_tuning=True)
    ),
    # the same for SigLIP2 and the Qwen3 layers (12 frozen, 4 trainable ones share the class)
    "ours-full-cd-backbone": lambda: mock.patch.object(
        torch,
        "compile",
        _with_options(blocks=("VisionLayer", "LanguageLayer"), coordinate_descent_tuning=True),
    ),
    # Inductor autotunes the DiT blocks' GEMMs only (Triton templates against cuBLAS): cuBLAS runs the M = 816
    # GEMMs below 70% of peak (2026-12-02: slower, and 5.4 minutes to start)
    "ours-full-autotune-dit": lambda: mock.patch.object(
        torch, "compile", _with_options(blocks=("TransformerBlock",), max_autotune_gemm=True)
    ),
    # the DiT blocks' column sums (bias gradients over 816 rows) as one kernel each instead of Inductor's split
    # reduction's two (a 2026-12-02 timeline: 2.3 + 1.3 us and a gap per bias gradient; measured slower)
    "ours-full-dit-unsplit-reductions": lambda: mock.patch.object(
        torch, "compile", _with_options(blocks=("TransformerBlock",), split_reductions=False)
    ),
    # Inductor's default reductions: no persistent variant past 1024 elements per row (before
    # `triton.multi_kernel` became a default of gr00t_model's compile_blocks)
    "ours-full-looped-reductions": lambda: mock.patch.object(
        torch, "compile", _with_options(**{"triton.multi_kernel": 0})
    ),
    # SigLIP2's q, k and v projections as three GEMMs (before 2026-12-02)
    "ours-full-separate-qkv": lambda: mock.patch("gr00t_model._model.merge_qkv", lambda attn: False),
    # the DiT's self-attention on SDPA's own pick, cuDNN on an H200 (before 2026-12-02)
    "ours-full-sdpa-self-attention": lambda: mock.patch("gr00t_model._dit.SELF_ATTENTION_EFFICIENT", False),
    # the DiT's dropout drawn inside its compiled blocks by Inductor's Philox code, one number per element,
    # instead of one Bernoulli draw of every block's keep-masks (before 2026-12-02)
    "ours-full-inductor-dropout": lambda: mock.patch(
        "gr00t_model._dit.AlternateVLDiT.keep_masks", lambda self, tokens: None
    ),
    # the keep-masks drawn by torch's bernoulli_ instead of gr00t-model's Triton kernel
    "ours-full-bernoulli-masks": lambda: mock.patch("gr00t_model._keep_mask._kernel", lambda: None),
    # each Qwen3 layer's block-final residual add as a pass of its own, outside the compiled blocks (it once
    # ended each compiled block, also a pass of its own)
    "ours-full-qwen3-adds-apart": lambda: mock.patch(
        "gr00t_model._language.LanguageModel.run_layers", _qwen3_adds_apart
    ),
    # SigLIP2's GELU as its own pass after the up-projection's GEMM (before 2026-12-01)
    "ours-full-separate-gelu": lambda: mock.patch("gr00t_model._model.gelu_into_gemm", lambda mlp: False),
    # graphs captured on a stream of the default priority, the optimizer's side stream's, instead of a higher
    # one (vla_graph's CAPTURE_PRIORITY; before 2026-12-02)
    "ours-full-capture-default-priority": lambda: mock.patch.dict(
        "vla_graph._device._CAPTURE_STREAMS", {torch.cuda.current_device(): torch.cuda.Stream(priority=0)}
    ),
    # the once-per-step pieces eager (gr00t_model GR00TN16.once_per_step: patch embedding, connector, image
    # placement, the RoPE tables, Qwen3's final norm and the vlln; before 2026-12-02 compile_blocks compiled
    # only the repeated blocks)
    "ours-full-eager-glue": lambda: mock.patch("gr00t_model._model.GR00TN16.once_per_step", lambda self: []),
    # each grouped embodiment layer sorting the batch by slot for itself (the earlier form:
    # ActionHead.slot_groups now shares one sort per forward; measured the same)
    "ours-full-per-layer-sorts": lambda: mock.patch(
        "gr00t_model._action_head.ActionHead.slot_groups", lambda self, slot: slot
    ),
    # the per-step NaN/inf sample tags by isfinite(...).all(), four kernels per tensor (the earlier form;
    # now one max-|value| reduction; measured the same)
    "ours-full-isfinite-tags": lambda: mock.patch(
        "gr00t_train._run_checks._nonfinite_rows", lambda rows: ~torch.isfinite(rows).all(dim=1)
    ),
    # the DiT's VL context cast by each cross block's projections under autocast, instead of once for all
    # cross blocks with its gradient summed in one compiled pass (gr00t_model._context_cast.CAST_ONCE; before
    # 2026-12-02)
    "ours-full-cast-context-per-block": lambda: mock.patch("gr00t_model._context_cast.CAST_ONCE", False),
    # the clipping norm's kernel with one 4096-element block per program (the earlier form: now 8 each)
    "ours-full-block-norm": lambda: mock.patch(
        "vla_overlap._flat_adamw_kernel.sum_of_squares", functools.partial(_kernels().sum_of_squares, loops=1)
    ),
    # fp32 gradient buffers where the stack now keeps bf16 ones (one microbatch, one rank; before 2026-12-01)
    "ours-full-fp32-grads": lambda: mock.patch(
        "gr00t_train._comm._grad_buffer_dtype", lambda cfg, env: torch.float32
    ),
}


def _qwen3_adds_apart(self, hidden, valid, start, stop):
    from gr00t_model._language import causal_padding_mask, rotary_tables

    if start >= stop:
        return hidden
    dtype = self.embed_tokens.weight.dtype
    cos, sin = rotary_tables(hidden.shape[1], self.head_dim, self.rope_theta, hidden.device, dtype)
    mask = causal_padding_mask(valid)
    for layer in self.layers[start:stop]:
        hidden, pending = layer(hidden, None, mask, (cos, sin))
        hidden = hidden + pending
    return hidden


def _unaligned_blocks(flat) -> None:
    from vla_overlap._flat_adamw import BLOCK

    for bucket in flat.buckets:
        exact = [
            (at, min(BLOCK, end - at), row)
            for start, end, row in bucket["runs"]
            for at in range(start, end, BLOCK)
        ]
        bucket["blocks"], bucket["align"] = torch.tensor(exact, device=bucket["master"].device), 1


def _torch_norm(flat):
    def grad_norm(norm_type: float) -> torch.Tensor:
        norms = [torch.linalg.vector_norm(bucket["grad"], norm_type) for bucket in flat.buckets]
        return torch.linalg.vector_norm(torch.stack(norms), norm_type)

    return grad_norm


def _with_options(blocks: tuple[str, ...] | None = None, **options):
    """torch.compile with Inductor `options`, for every block or only for the block classes named in `blocks`."""
    compile_ = torch.compile

    def compile_with_options(fn, **kwargs):
        owner = type(getattr(fn, "__self__", None)).__name__
        if blocks is not None and owner not in blocks:
            return compile_(fn, **kwargs)
        return compile_(fn, options={**kwargs.pop("options", {}), **options}, **kwargs)

    return compile_with_options


def _kernels():
    import vla_overlap._flat_adamw_kernel as kernels

    return kernels
