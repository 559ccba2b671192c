"""`data.prefix_cache`: train the trainable part of the model from stored features of its frozen part."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from ..config.types import Section, require


@dataclass(kw_only=True)
class PrefixCacheConfig(Section):
    """An offline cache of the frozen prefix's output (the vision tower, connector, token embeddings and the
    frozen LLM layers: everything before the first trainable weight), computed once per training sample and
    augmentation variant before the first step; training then reads it instead of decoding video and
    running the frozen prefix. Needs a frozen vision tower and embeddings (model.tune_visual and
    model.tune_llm false); with several processes (one host) a disk cache, each building its share."""

    mode: Literal["off", "memory", "disk"] = "off"
    """off = no cache; memory = built into host memory at every start; disk = built once into `dir` and
    reused by later runs whose dataset, frozen weights and processor settings are the same (a change builds
    a new one)."""
    dtype: Literal["bf16", "fp8", "fp32"] = "bf16"
    """How features are stored: bf16 (exact when the model computes in bf16, the default on a GPU), fp8
    (e4m3 with one scale per token: half of bf16's bytes, about 2 significant digits) or fp32."""
    variants: int = 1
    """Augmented versions of each sample (data.augment): epoch e trains on variant e mod variants, so a
    sample shows `variants` fixed random crops and color jitters in turn instead of a fresh one per epoch.
    Must be 1 without augmentation."""
    dir: str | None = None
    """Where disk caches are kept (one subfolder per fingerprint); None = `<output_dir>/prefix_cache`. Never
    inside the dataset."""
    build_batch_size: int | None = None
    """Samples per forward while building; None = data.batch_size."""

    def _check(self) -> None:
        require(self.variants >= 1, "variants", f"must be >= 1, got {self.variants}")
        size = self.build_batch_size
        require(size is None or size >= 1, "build_batch_size", f"must be >= 1 or none, got {size}")
