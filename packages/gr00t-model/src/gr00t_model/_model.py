"""GR00T N1.6: the VLM backbone plus the flow-matching action head, with the release's training policy."""

from __future__ import annotations

import contextlib
from collections.abc import Mapping
from typing import Any

import torch
from torch import nn

from . import _context_cast as context_cast
from ._action_head import ActionHead
from ._backbone import Backbone, FrozenPrefix
from ._checkpointing import checkpointed_forward, saves
from ._config import GR00TConfig
from ._frozen_linear import gelu_into_gemm, merge_qkv, pad_mlp, use_fp8
from ._inductor_cache import caching_custom_functions, let_multi_kernels_load_from_cache

BATCH_KEYS = ("input_ids", "attention_mask", "pixel_values", "state", "embodiment_id")

INDUCTOR_OPTIONS = {
    # Reductions up to 16x longer than Inductor's default (1024 elements per row) get a persistent variant
    # too, and the faster one is kept (timed once, on first run). SigLIP2's LayerNorms over 1152 channels
    # otherwise run looped at about 1 TB/s: +2.3% samples/s on an H200 (BENCHMARKS.md, levers tried).
    "triton.multi_kernel": 1,
}
# A multi-kernel graph loads back from Inductor's FX graph cache (and so from AOTAutograd's) only with
# _inductor_cache's fix: compile_blocks applies it, so a second run reuses the first one's compiled graphs.


class GR00TN16(nn.Module):
    """GR00T N1.6 vision-language-action model.

    Batch (a mapping of tensors on the model's device, fixed shapes):
      input_ids [B, S] int64, attention_mask [B, S] (bool or int), pixel_values [B, N, 3, H, W] (normalized
      float, or uint8 frames already at the model's image size), state [B, 1, max_state_dim],
      embodiment_id [B] int64, and for training action [B, action_horizon, max_action_dim] and action_mask
      (same shape, 1 on real entries).
    """

    def __init__(self, config: GR00TConfig) -> None:
        super().__init__()
        self.config = config
        self.backbone = Backbone(config)
        self.action_head = ActionHead(config)
        self.apply_training_policy()

    @staticmethod
    def import_dependencies(triton_attention: bool = False) -> None:
        """Import the modules building a model needs beyond this one's (the layers are our own: no
        transformers modeling code): with `triton_attention`, the Triton attention op where Triton imports.
        The first build imports it anyway; calling this first lets a caller time the imports apart from the
        build."""
        from ._attention import load_triton

        if triton_attention:
            load_triton()

    # ----------------------------------------------------------------- policy
    def apply_training_policy(self) -> None:
        """Set requires_grad from the config's tune_* fields, then store frozen / trainable weights in their dtypes."""
        c = self.config
        self.requires_grad_(True)
        if not c.tune_llm:
            self.backbone.language_model.requires_grad_(False)
        if not c.tune_visual:
            self.backbone.vision_model.requires_grad_(False)
            self.backbone.mlp1.requires_grad_(False)
        for layer in self.backbone.language_model.layers[
            len(self.backbone.language_model.layers) - c.tune_top_llm_layers :
        ]:
            layer.requires_grad_(True)
        head = self.action_head
        if not c.tune_projector:
            for module in (
                head.state_encoder,
                head.action_encoder,
                head.action_decoder,
                head.position_embedding,
            ):
                module.requires_grad_(False)
            if hasattr(head, "mask_token"):
                head.mask_token.requires_grad_(False)
        head.model.requires_grad_(c.tune_diffusion_model)
        head.vlln.requires_grad_(c.tune_vlln)
        frozen, trainable = getattr(torch, c.frozen_dtype), getattr(torch, c.trainable_dtype)
        autocast = c.compute_dtype not in (None, "float32")
        matmul = {id(p) for p in self.matmul_weights()}
        for param in self.parameters():
            if not param.requires_grad:
                dtype = frozen
            elif not autocast or id(param) in matmul:
                dtype = trainable
            else:  # autocast computes norms, embeddings and bias adds from the fp32 value: keep it
                dtype = torch.float32
            param.data = param.data.to(dtype)
        self.train(self.training)

    def matmul_weights(self) -> list[nn.Parameter]:
        """Linear weights and biases: each is read once per forward, by a matrix product that autocast feeds
        with its bf16 rounding, so storing them in bf16 computes the same forward and the same gradients.
        The per-embodiment tables only with `grouped_embodiment_gemms` (their biases never: added in fp32):
        in the release's form every sample gathers its slot's matrix, and the gradients of those gathers
        accumulate in the weight's dtype (fp32 keeps them exact); grouped, one GEMM per slot makes each
        table's gradient, as for a Linear."""
        out = []
        for module in self.modules():
            if isinstance(module, nn.Linear):
                out += [p for p in (module.weight, module.bias) if p is not None]
        if self.config.grouped_embodiment_gemms:
            out += [layer.W for layer in self.action_head.embodiment_layers()]
        return out

    def prepare_frozen_prefix(self, fp8: bool = False) -> dict[str, int]:
        """Prepare the frozen weights of the vision side once for faster GEMMs (`_frozen_linear`): each frozen
        SigLIP2 MLP padded from 4304 to 4352 wide (the same result; compiled, the down-projection then
        takes cuBLAS's fused-bias kernel) with its GELU computed in the up-projection's GEMM epilogue, each
        frozen SigLIP2 attention's q, k and v projections computed as one GEMM (not with `fp8`), and
        with `fp8` the frozen prefix's linear layers (SigLIP2 encoder, connector, frozen Qwen3 layers) in FP8
        with rowwise scales. FP8 changes the numerics and applies only
        when nothing before the first trainable weight needs gradients (the vision side frozen). Call before
        `compile_blocks`; parameters and state dict do not change. Returns the counts of what changed."""
        backbone = self.backbone
        layers = backbone.vision_model.encoder.layers
        padded = sum(pad_mlp(layer.mlp) for layer in layers)
        gelu_in_gemm = sum(gelu_into_gemm(layer.mlp) for layer in layers)
        # One GEMM for q, k and v; FP8 keeps three FP8 GEMMs instead (and drops an earlier call's merge).
        for attn in (layer.self_attn for layer in layers if fp8 and hasattr(layer.self_attn, "qkv")):
            del attn.qkv
        merged = 0 if fp8 else sum(merge_qkv(layer.self_attn) for layer in layers)
        depth = backbone.frozen_depth()
        quantized = 0
        if fp8 and depth is not None:
            # Not SigLIP2's down-projection: quantizing its 4352-wide input row by row costs more (5.0 ms per
            # step on an H200) than its FP8 GEMM saves (0.6 ms).
            quantized = use_fp8([backbone.vision_model.encoder], exclude=("mlp.fc2",)) + use_fp8(
                [backbone.mlp1, *backbone.language_model.layers[:depth]]
            )
        return {
            "padded_mlps": padded,
            "gelu_in_gemm": gelu_in_gemm,
            "merged_qkv": merged,
            "fp8_linears": quantized,
        }

    def repeated_blocks(self) -> list[nn.Module]:
        """Every instance of the repeated blocks: SigLIP2 encoder layers, Qwen3 decoder layers, DiT blocks."""
        return [
            *self.backbone.vision_model.encoder.layers,
            *self.backbone.language_model.layers,
            *self.action_head.model.transformer_blocks,
        ]

    def once_per_step(self) -> list[tuple[nn.Module, str]]:
        """The eager pieces around the repeated blocks that compile_blocks compiles too, as (owner, method
        name); each runs once per forward (`Backbone.once_per_step`, and the action head's vlln LayerNorm with
        the cross-attention masks)."""
        return [*self.backbone.once_per_step(), (self.action_head, "features")]

    def recomputed_blocks(self) -> list[nn.Module]:
        """The blocks of checkpoint_blocks (DiT blocks, Qwen3 layers): each recomputes its activations under
        checkpoint_policy whenever a backward needs them (gradients on, and it trains or its input carries a
        gradient). compile_blocks compiles the checkpoint with each (`_checkpointing.checkpointed_forward`)."""
        dit, lm = self.action_head.model, self.backbone.language_model
        return [*(dit.transformer_blocks if dit.recompute else ()), *(lm.layers if lm.recompute else ())]

    @staticmethod
    def kept_by_selective_recompute(op: Any) -> bool:
        """Whether a selectively recomputed block keeps the outputs of `op` (an aten or custom OpOverload) for
        its backward: GEMMs and attention (`_checkpointing.SAVED_OPS`)."""
        return saves(op)

    def compile_blocks(self, **options: Any) -> int:
        """torch.compile the forward of every repeated block, in place (parameter names and state dicts do
        not change). Compiled per block class, so each block type (and each distinct input signature, e.g.
        frozen vs trainable Qwen3 layers) compiles once and every instance reuses it. So do the eager pieces
        that run once per step around them (`once_per_step`: patch embedding, connector, image placement);
        the rest stays eager. A block of checkpoint_blocks compiles with its checkpoint (`recomputed_blocks`):
        its compiled backward does the recomputation. `options` go to torch.compile (default: dynamic=False,
        and with Inductor this module's `INDUCTOR_OPTIONS` unless `mode` or Inductor `options` are given).
        Returns the count of repeated blocks."""
        options = {"dynamic": False, **options}
        if options.get("backend", "inductor") == "inductor":
            let_multi_kernels_load_from_cache()
            if "mode" not in options:
                options["options"] = {**INDUCTOR_OPTIONS, **options.get("options", {})}
        blocks = self.repeated_blocks()
        recomputed = self.recomputed_blocks()
        for block, name in [(block, "forward") for block in blocks] + self.once_per_step():
            if name not in vars(block):
                method = getattr(type(block), name).__get__(block)
                if name == "forward" and block in recomputed:  # the checkpoint compiled with the block
                    policy = self.config.checkpoint_policy
                    method, block.checkpoints_itself = checkpointed_forward(block, policy), True
                setattr(block, name, caching_custom_functions(torch.compile(method, **options)))
        dit = self.action_head.model
        if dit.grad_sum is None:  # the DiT context cast's gradient sum: one fused kernel (_context_cast)
            dit.grad_sum = caching_custom_functions(torch.compile(context_cast.sum_grads, **options))
        return len(blocks)

    def uncompile_blocks(self) -> None:
        """Undo compile_blocks: every block runs its plain forward again."""
        for block, name in [(block, "forward") for block in self.repeated_blocks()] + self.once_per_step():
            vars(block).pop(name, None)
            vars(block).pop("checkpoints_itself", None)
        self.action_head.model.grad_sum = None

    def train(self, mode: bool = True) -> GR00TN16:
        """As nn.Module.train, but a frozen DiT stays in eval mode (no dropout), as in the release."""
        super().train(mode)
        if mode and not self.config.tune_diffusion_model:
            self.action_head.model.eval()
        return self

    def _autocast(self, device: torch.device):
        dtype = self.config.compute_dtype
        if dtype is None or dtype == "float32":
            return contextlib.nullcontext()
        # No cast cache: weights are cast where used, which stays valid inside a captured CUDA graph.
        return torch.autocast(device_type=device.type, dtype=getattr(torch, dtype), cache_enabled=False)

    # ----------------------------------------------------------- checkpoints
    def save_pretrained(self, path, **kwargs):
        """Same as gr00t_model.save_pretrained(self, path, **kwargs)."""
        from ._checkpoint import save_pretrained

        return save_pretrained(self, path, **kwargs)

    @classmethod
    def from_pretrained(cls, path, **kwargs):
        """Same as gr00t_model.from_pretrained(path, **kwargs)."""
        from ._checkpoint import from_pretrained

        return from_pretrained(path, **kwargs)

    # ---------------------------------------------------------------- forward
    def _features(self, batch: Mapping[str, torch.Tensor], prefix: FrozenPrefix | None = None):
        if prefix is None:
            inputs = (batch["input_ids"], batch["attention_mask"], batch["pixel_values"])
        else:  # the prefix replaces the prompt and the images: a batch of prefix features has neither
            inputs = (None, None, None)
        features, valid, image_mask = self.backbone(*inputs, prefix)
        return self.action_head.features(features, valid, image_mask)

    def frozen_prefix(self, batch: Mapping[str, torch.Tensor]) -> FrozenPrefix | None:
        """The part of the forward that reads no trainable parameter (vision tower, connector, embeddings and
        the frozen LLM layers), to pass to `forward(..., prefix=)`; None when the vision side trains. It can
        run while trainable weights are being updated."""
        with self._autocast(batch["input_ids"].device):
            return self.backbone.frozen_prefix(
                batch["input_ids"], batch["attention_mask"], batch["pixel_values"]
            )

    PREFIX_KEYS = ("hidden", "valid", "image_mask")
    """The tensors of `prefix_features`: LLM hidden states [B, S, D] after the frozen layers, the valid-token
    mask [B, S] bool and the image-token mask [B, S] bool."""

    @torch.no_grad()
    def prefix_features(self, batch: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """The frozen part's output as plain tensors (`PREFIX_KEYS`), without gradients: what an offline cache
        stores once per sample. The frozen part is the vision tower, connector, token embeddings and the
        leading LLM layers that read no trainable weight (`frozen_depth`; with `tune_top_llm_layers=0` every
        kept layer, the final norm excepted). ValueError when nothing is frozen before the first trainable
        weight (tune_visual or tune_llm)."""
        prefix = self.frozen_prefix(batch)
        if prefix is None:
            raise ValueError(
                "no frozen prefix: the vision tower, connector or token embeddings train "
                f"(tune_visual={self.config.tune_visual}, tune_llm={self.config.tune_llm})"
            )
        return {"hidden": prefix.hidden, "valid": prefix.valid, "image_mask": prefix.image_mask}

    def frozen_depth(self) -> int | None:
        """How many leading LLM layers `prefix_features` covers (None: nothing is frozen, see there)."""
        return self.backbone.frozen_depth()

    def forward_from_prefix(
        self,
        features: Mapping[str, torch.Tensor],
        batch: Mapping[str, torch.Tensor],
        noise: torch.Tensor | None = None,
        t: torch.Tensor | None = None,
    ) -> dict[str, torch.Tensor]:
        """`forward` continued from `prefix_features(batch)` (e.g. read back from a cache): the trainable
        part and the loss. The batch needs only state, action, action_mask and embodiment_id; the result
        equals `forward(batch, noise, t)` when the features are unchanged."""
        return self.forward(batch, noise, t, prefix=self.prefix_from_features(features))

    def prefix_from_features(self, features: Mapping[str, torch.Tensor]) -> FrozenPrefix:
        """The `FrozenPrefix` that `forward(..., prefix=)` takes, from `prefix_features`' tensors."""
        depth = self.backbone.frozen_depth()
        if depth is None:
            raise ValueError("no frozen prefix to continue from: the vision side or the embeddings train")
        missing = [key for key in self.PREFIX_KEYS if key not in features]
        if missing:
            raise KeyError(f"prefix features are missing {missing}; they have {sorted(features)}")
        return FrozenPrefix(
            features["hidden"], features["valid"].bool(), features["image_mask"].bool(), depth
        )

    def forward(
        self,
        batch: Mapping[str, torch.Tensor],
        noise: torch.Tensor | None = None,
        t: torch.Tensor | None = None,
        prefix: FrozenPrefix | None = None,
    ) -> dict[str, torch.Tensor]:
        """Training step's forward: {"loss": scalar fp32, "valid": number of real action entries}.

        `noise` [B, action_horizon, max_action_dim] and flow time `t` [B] in [0, 1) are drawn inside when not
        given; pass them to draw them outside a captured graph. `prefix`: this batch's `frozen_prefix(batch)`,
        computed earlier (the result is the same). No host synchronisation happens here.
        """
        action, action_mask = batch["action"], batch["action_mask"]
        self._check_action_shape(action)
        if noise is None:
            noise = torch.randn(action.shape, device=action.device, dtype=torch.float32)
        if t is None:
            t = self.action_head.sample_time(action.shape[0], action.device)
        with self._autocast(action.device):
            vl, masks = self._features(batch, prefix)
            loss = self.action_head.loss(
                vl, masks, batch["state"], action, action_mask, batch["embodiment_id"], noise, t
            )
        return {"loss": loss, "valid": action_mask.to(torch.float32).sum()}

    @torch.no_grad()
    def get_action(
        self,
        batch: Mapping[str, torch.Tensor],
        noise: torch.Tensor | None = None,
        num_steps: int | None = None,
    ) -> torch.Tensor:
        """Normalized action chunk [B, action_horizon, max_action_dim] by Euler integration (default 4 steps)."""
        state = batch["state"]
        shape = (state.shape[0], self.config.action_horizon, self.config.max_action_dim)
        if noise is None:
            noise = torch.randn(shape, device=state.device, dtype=torch.float32)
        elif tuple(noise.shape) != shape:
            raise ValueError(f"noise must have shape {shape}, got {tuple(noise.shape)}")
        steps = self.config.num_inference_timesteps if num_steps is None else num_steps
        if steps < 0:
            raise ValueError(f"num_steps must be >= 0, got {steps}")
        with self._autocast(state.device):
            vl, masks = self._features(batch)
            return self.action_head.sample(vl, masks, state, batch["embodiment_id"], noise, steps)

    # ------------------------------------------------------------- checking
    def _check_action_shape(self, action: torch.Tensor) -> None:
        expected = (self.config.action_horizon, self.config.max_action_dim)
        if tuple(action.shape[1:]) != expected:
            raise ValueError(
                f"batch['action'] must be [B, {expected[0]}, {expected[1]}], got {tuple(action.shape)}"
            )

    def validate_batch(self, batch: Mapping[str, torch.Tensor]) -> None:
        """Eager check of a batch's keys, shapes and image-token counts (reads values: not for captured graphs)."""
        missing = [k for k in BATCH_KEYS if k not in batch]
        if missing:
            raise KeyError(f"batch is missing keys {missing}; it has {sorted(batch)}")
        c = self.config
        ids, pixels = batch["input_ids"], batch["pixel_values"]
        if pixels.ndim != 5 or tuple(pixels.shape[2:]) != (3, *c.image_size):
            raise ValueError(
                f"batch['pixel_values'] must be [B, N, 3, {c.image_size[0]}, {c.image_size[1]}], got {tuple(pixels.shape)}"
            )
        expected = pixels.shape[1] * c.image_tokens_per_image
        counts = (ids == c.image_token_id).sum(dim=1).tolist()
        bad = [(row, n) for row, n in enumerate(counts) if n != expected]
        if bad:
            raise ValueError(
                f"batch['input_ids'] rows must each hold {expected} image tokens (id {c.image_token_id}) for "
                f"{pixels.shape[1]} images; (row, count) wrong: {bad[:5]}"
            )
        if tuple(batch["state"].shape[1:]) != (1, c.max_state_dim):
            raise ValueError(
                f"batch['state'] must be [B, 1, {c.max_state_dim}], got {tuple(batch['state'].shape)}"
            )
        slots = batch["embodiment_id"]
        if bool(((slots < 0) | (slots >= c.max_num_embodiments)).any()):
            raise ValueError(
                f"batch['embodiment_id'] values must be in [0, {c.max_num_embodiments}), got {slots.tolist()}"
            )
        if "action" in batch:
            self._check_action_shape(batch["action"])
            if batch["action_mask"].shape != batch["action"].shape:
                raise ValueError("batch['action_mask'] must have the shape of batch['action']")
