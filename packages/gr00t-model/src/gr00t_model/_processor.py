"""The processor: a collated batch of raw samples -> the model's fixed-shape input tensors.

Designed for a data-pipeline thread: plain torch on CPU, prompts tokenized once per distinct task string.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from ._config import GR00TConfig
from ._images import ImageSpec, preprocess_images
from ._normalize import EmbodimentSpec
from ._tokenizer import load_tokenizer

IMAGE_CONTEXT, IMAGE_START, IMAGE_END = "<IMG_CONTEXT>", "<img>", "</img>"
_PUNCTUATION = re.compile(r"[^\w\s]")


@dataclass(kw_only=True)
class ProcessorConfig:
    """Choices of the processor that are not model sizes."""

    num_images: int = 1
    """Images per sample (cameras x frames), in prompt order (frame-major: index t * views + v)."""
    vlm_seq_len: int | None = None
    """Pad every VLM token sequence to exactly this length (graph mode); None pads to the batch's longest."""
    padding_side: str = "left"
    """Where padding tokens go ("left" as the release, or "right")."""
    formalize_language: bool = True
    """Lowercase the task and strip punctuation, as the release does."""
    system_prompt: str = "You are a helpful assistant."
    image_mode: str = "torch"
    """"torch": uint8 `images` are letterboxed/center-cropped/resized/normalized here, per camera, into
    `pixel_values`, as for inference;
    "passthrough": they are returned untouched under `images` for a later step (e.g. on the GPU) that uses
    `processor.image_spec`."""
    crop_fraction: float = 0.95
    """Side fraction kept by the crop (see `ImageSpec`)."""
    token_cache_size: int = 4096
    """Distinct task strings whose token ids are kept."""

    def __post_init__(self) -> None:
        if self.num_images <= 0:
            raise ValueError(f"ProcessorConfig.num_images must be > 0, got {self.num_images}")
        if self.padding_side not in ("left", "right"):
            raise ValueError(
                f"ProcessorConfig.padding_side must be 'left' or 'right', got {self.padding_side!r}"
            )
        if self.image_mode not in ("torch", "passthrough"):
            raise ValueError(
                f"ProcessorConfig.image_mode must be 'torch' or 'passthrough', got {self.image_mode!r}"
            )
        if not 0 < self.crop_fraction <= 1:
            raise ValueError(f"ProcessorConfig.crop_fraction must be in (0, 1], got {self.crop_fraction}")
        if self.vlm_seq_len is not None and self.vlm_seq_len <= 0:
            raise ValueError(f"ProcessorConfig.vlm_seq_len must be > 0 or None, got {self.vlm_seq_len}")


class GR00TProcessor:
    """Prompt + tokens, image tensors, normalized/padded state and action, masks and embodiment ids.

    Input (`__call__`): a mapping with
      images   uint8 [B, N, 3, H, W] or [B, N, H, W, 3] (any size; torch mode letterboxes, crops and resizes
               each camera), or a list of N per-camera uint8 [B, 3, H, W] whose sizes may differ, or
      pixel_values  float [B, N, 3, h, w] already at `image_spec.size` and normalized (passed through);
      state    raw [B, D] or [B, 1, D];  action (optional) raw [B, T, D] with T <= the embodiment's horizon;
      embodiment (optional) a tag or one tag per row (default: the only EmbodimentSpec);
      task (optional) list of B strings, unless given as `tasks`.
    Output: input_ids [B, S] int64, attention_mask [B, S] bool, pixel_values (or images), state [B, 1,
    max_state_dim], action + action_mask [B, action_horizon, max_action_dim] (when action is given),
    embodiment_id [B] int64; all torch tensors on the CPU.
    """

    def __init__(
        self,
        model_config: GR00TConfig,
        embodiments: EmbodimentSpec | Sequence[EmbodimentSpec],
        *,
        tokenizer: Any = None,
        config: ProcessorConfig | None = None,
    ) -> None:
        self.model_config = model_config
        self.config = config or ProcessorConfig()
        specs = [embodiments] if isinstance(embodiments, EmbodimentSpec) else list(embodiments)
        if not specs:
            raise ValueError("GR00TProcessor needs at least one EmbodimentSpec")
        self.embodiments = {s.tag: s for s in specs}
        for spec in specs:
            self._check_spec(spec)
        # None: the bundled tiny tokenizer; a str / Path: a local Hugging Face tokenizer; else a tokenizer object.
        is_path = tokenizer is None or isinstance(tokenizer, (str, os.PathLike))
        self.tokenizer = load_tokenizer(tokenizer) if is_path else tokenizer
        self._check_tokenizer()
        self._tokens: dict[str, list[int]] = {}

    # ----------------------------------------------------------------- checks
    def _check_spec(self, spec: EmbodimentSpec) -> None:
        c = self.model_config
        if spec.state_dim > c.max_state_dim or spec.action_dim > c.max_action_dim:
            raise ValueError(
                f"embodiment {spec.tag!r}: state {spec.state_dim} / action {spec.action_dim} dims exceed the model's "
                f"max_state_dim {c.max_state_dim} / max_action_dim {c.max_action_dim}"
            )
        if spec.action_horizon > c.action_horizon:
            raise ValueError(
                f"embodiment {spec.tag!r}: action_horizon {spec.action_horizon} > model action_horizon {c.action_horizon}"
            )
        if spec.slot >= c.max_num_embodiments:
            raise ValueError(
                f"embodiment {spec.tag!r}: slot {spec.slot} >= max_num_embodiments {c.max_num_embodiments}"
            )

    def _check_tokenizer(self) -> None:
        token_id = self.tokenizer.convert_tokens_to_ids(IMAGE_CONTEXT)
        if token_id != self.model_config.image_token_id:
            raise ValueError(
                f"tokenizer maps {IMAGE_CONTEXT} to {token_id}, the model config expects image_token_id "
                f"{self.model_config.image_token_id}"
            )
        if len(self.tokenizer) > self.model_config.vocab_size:
            raise ValueError(
                f"tokenizer has {len(self.tokenizer)} tokens, more than the model's vocab_size {self.model_config.vocab_size}"
            )
        pad = self.tokenizer.pad_token_id
        self.pad_id = pad if pad is not None else (self.tokenizer.eos_token_id or 0)

    # ------------------------------------------------------------------ parts
    @property
    def image_spec(self) -> ImageSpec:
        """Target size and normalization an external (GPU) image step must produce."""
        return ImageSpec(size=self.model_config.image_size, crop_fraction=self.config.crop_fraction)

    def prompt(self, task: str) -> str:
        """The chat-template text of one sample: system turn, then the user turn with the task and the images."""
        text = _PUNCTUATION.sub("", task.lower()).strip() if self.config.formalize_language else task
        run = IMAGE_CONTEXT * self.model_config.image_tokens_per_image
        images = "".join(
            f"<image {k + 1}>{IMAGE_START}{run}{IMAGE_END}" for k in range(self.config.num_images)
        )
        return f"<|im_start|>system\n{self.config.system_prompt}<|im_end|>\n<|im_start|>user\n{text}{images}<|im_end|>\n"

    def token_ids(self, task: str) -> list[int]:
        """Token ids of prompt(task), cached per task string."""
        ids = self._tokens.get(task)
        if ids is None:
            ids = list(self.tokenizer(self.prompt(task), add_special_tokens=False)["input_ids"])
            expected = self.config.num_images * self.model_config.image_tokens_per_image
            found = sum(1 for i in ids if i == self.model_config.image_token_id)
            if found != expected:
                raise ValueError(
                    f"task {task!r}: prompt tokenized to {found} image tokens, expected {expected}"
                )
            if len(self._tokens) >= self.config.token_cache_size:
                self._tokens.pop(next(iter(self._tokens)))
            self._tokens[task] = ids
        return ids

    def max_sequence_length(self, tasks: Sequence[str]) -> int:
        """Longest prompt over `tasks` in tokens: a safe `vlm_seq_len` for a dataset with these task strings."""
        return max(len(self.token_ids(t)) for t in tasks)

    def tokenize(self, tasks: Sequence[str]) -> tuple[torch.Tensor, torch.Tensor]:
        """input_ids [B, S] and attention_mask [B, S] bool, padded to vlm_seq_len or the longest prompt."""
        rows = [self.token_ids(t) for t in tasks]
        length = max(len(r) for r in rows)
        if self.config.vlm_seq_len is not None:
            too_long = [(t, len(r)) for t, r in zip(tasks, rows) if len(r) > self.config.vlm_seq_len]
            if too_long:
                raise ValueError(
                    f"ProcessorConfig.vlm_seq_len={self.config.vlm_seq_len} is shorter than the prompt of task {too_long[0][0]!r} ({too_long[0][1]} tokens)"
                )
            length = self.config.vlm_seq_len
        ids = torch.full((len(rows), length), self.pad_id, dtype=torch.long)
        mask = torch.zeros(len(rows), length, dtype=torch.bool)
        for i, row in enumerate(rows):
            span = (
                slice(length - len(row), length) if self.config.padding_side == "left" else slice(0, len(row))
            )
            ids[i, span] = torch.tensor(row, dtype=torch.long)
            mask[i, span] = True
        return ids, mask

    def _specs(self, batch: Mapping[str, Any], size: int) -> list[EmbodimentSpec]:
        tags = batch.get("embodiment")
        if tags is None:
            if len(self.embodiments) != 1:
                raise KeyError(f"batch needs 'embodiment' (the processor knows {sorted(self.embodiments)})")
            tags = next(iter(self.embodiments))
        tags = [tags] * size if isinstance(tags, str) else list(tags)
        unknown = sorted(set(tags) - set(self.embodiments))
        if unknown or len(tags) != size:
            raise ValueError(
                f"batch['embodiment']: need {size} known tags, got unknown {unknown} / {len(tags)} tags"
            )
        return [self.embodiments[t] for t in tags]

    def _images(self, batch: Mapping[str, Any], size: int) -> dict[str, Any]:
        c, n = self.model_config, self.config.num_images
        if "pixel_values" in batch:
            pixels = torch.as_tensor(batch["pixel_values"])
            if tuple(pixels.shape) != (size, n, 3, *c.image_size) or not pixels.is_floating_point():
                raise ValueError(
                    f"batch['pixel_values'] must be float [{size}, {n}, 3, {c.image_size[0]}, {c.image_size[1]}], got {pixels.dtype} {tuple(pixels.shape)}"
                )
            return {"pixel_values": pixels}
        if "images" not in batch:
            raise KeyError("batch needs 'images' (uint8 frames) or 'pixel_values' (prepared floats)")
        images = batch["images"]
        if isinstance(images, (list, tuple)):  # one tensor per camera: sizes and aspect ratios may differ
            views = [torch.as_tensor(v) for v in images]
            ok = len(views) == n and all(
                v.ndim == 4 and v.shape[0] == size and v.dtype == torch.uint8 for v in views
            )
            shapes = [f"{v.dtype} {tuple(v.shape)}" for v in views]
            if not ok:
                raise ValueError(
                    f"batch['images'] as a list must hold {n} uint8 [{size}, 3, H, W] (or [{size}, H, W, 3]) "
                    f"tensors, one per camera, got {shapes}"
                )
        else:
            views = torch.as_tensor(images)
            if views.ndim != 5 or views.shape[:2] != (size, n) or views.dtype != torch.uint8:
                raise ValueError(
                    f"batch['images'] must be uint8 [{size}, {n}, 3, H, W] or [{size}, {n}, H, W, 3], or a list of "
                    f"{n} per-camera tensors, got {views.dtype} {tuple(views.shape)}"
                )
        if self.config.image_mode == "passthrough":
            return {"images": images}
        return {"pixel_values": preprocess_images(views, self.image_spec)}

    # ------------------------------------------------------------------- main
    def __call__(
        self, batch: Mapping[str, Any], tasks: Sequence[str] | None = None
    ) -> dict[str, torch.Tensor]:
        """Process a collated batch (see the class docstring for keys and shapes)."""
        tasks = list(tasks if tasks is not None else batch.get("task") or [])
        size = len(tasks)
        if size == 0:
            raise KeyError("no task strings: pass `tasks` or batch['task']")
        if "state" not in batch:
            raise KeyError("batch needs 'state'")
        specs = self._specs(batch, size)
        state = torch.as_tensor(batch["state"])
        state = state[:, -1] if state.ndim == 3 else state
        if state.ndim != 2 or state.shape[0] != size:
            raise ValueError(
                f"batch['state'] must be [{size}, D] or [{size}, 1, D], got {tuple(state.shape)}"
            )
        out = dict(zip(("input_ids", "attention_mask"), self.tokenize(tasks)))
        out.update(self._images(batch, size))
        out["state"] = self._pad_states(specs, state)
        if "action" in batch:
            out["action"], out["action_mask"] = self._pad_actions(
                specs, torch.as_tensor(batch["action"]), state
            )
        out["embodiment_id"] = torch.tensor([s.slot for s in specs], dtype=torch.long)
        return out

    def _groups(self, specs: list[EmbodimentSpec]) -> dict[str, list[int]]:
        rows: dict[str, list[int]] = {}
        for i, spec in enumerate(specs):
            rows.setdefault(spec.tag, []).append(i)
        return rows

    def _pad_states(self, specs: list[EmbodimentSpec], state: torch.Tensor) -> torch.Tensor:
        out = torch.zeros(len(specs), 1, self.model_config.max_state_dim)
        for tag, rows in self._groups(specs).items():
            spec = self.embodiments[tag]
            out[rows, 0, : spec.state_dim] = spec.normalize_state(state[rows])
        return out

    def _pad_actions(self, specs: list[EmbodimentSpec], action: torch.Tensor, state: torch.Tensor):
        c = self.model_config
        size, steps = action.shape[0], action.shape[1] if action.ndim == 3 else -1
        if action.ndim != 3 or size != len(specs):
            raise ValueError(f"batch['action'] must be [{len(specs)}, T, D], got {tuple(action.shape)}")
        values = torch.zeros(size, c.action_horizon, c.max_action_dim)
        mask = torch.zeros_like(values)
        for tag, rows in self._groups(specs).items():
            spec = self.embodiments[tag]
            if steps > spec.action_horizon:
                raise ValueError(
                    f"batch['action'] has {steps} steps, embodiment {tag!r} allows {spec.action_horizon}"
                )
            values[rows, :steps, : spec.action_dim] = spec.normalize_action(action[rows], state[rows])
            mask[rows, :steps, : spec.action_dim] = 1.0
        return values, mask

    def decode_action(self, action: torch.Tensor, state: Any, embodiment: str | None = None) -> torch.Tensor:
        """Model output [B, action_horizon, max_action_dim] -> raw actions [B, horizon, D] of one embodiment.

        `state` is the raw state [B, D] (or [B, 1, D]) the prediction was made from (relative groups add it back).
        """
        spec = self._specs({"embodiment": embodiment} if embodiment else {}, action.shape[0])[0]
        state = torch.as_tensor(state)
        state = state[:, -1] if state.ndim == 3 else state
        chunk = action.detach().to("cpu", torch.float32)[:, : spec.action_horizon, : spec.action_dim]
        return spec.unnormalize_action(chunk, state)
