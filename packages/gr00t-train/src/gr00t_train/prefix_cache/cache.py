"""data.prefix_cache: train the trainable part of GR00T from stored features of its frozen prefix.

When the vision tower, connector, token embeddings and the lower LLM layers are frozen, their output for a
sample never changes while training (only its random augmentation does). The cache computes it once per
training sample and augmentation variant (`prefix_cache.build`), keeps it in host memory or on disk
(`prefix_cache.store`), and training reads it (`prefix_cache.source`) and runs only the trainable part:
the top LLM layers, vlln and the action head (`GR00TN16.forward_from_prefix`). The step itself is the same
(CUDA graphs, compiled blocks, the optimizer's side stream); only the batches and the loss's prefix change.

A disk cache is keyed by a fingerprint of everything its numbers depend on (the dataset's files, the
training episodes, the frozen weights, the model and processor settings, the augmentation, the storage
dtype, the device and the library versions): a rerun with the same inputs reuses it, a change builds a new
one beside it."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import os
import shutil
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import gr00t_model
import torch

from .._distributed import DistEnv
from .._errors import ConfigError
from .._parts import TrainParts
from ..config.optimizations import resolve_optimizations
from ..config.sections import TrainConfig
from ..data.fingerprint import fingerprint as dataset_fingerprint
from ..model import gr00t as _gr00t
from ..run_folder.checks import refuse_dataset_folder
from .build import build_store
from .source import CachedSource
from .store import FeatureStore, dequantize, remove_abandoned

log = logging.getLogger(__name__)

SETTING = "data.prefix_cache.mode"
TRAINING_ONLY = (
    "checkpoint_blocks", "checkpoint_policy", "grouped_embodiment_gemms", "merged_dit_linears", "triton_attention",
    "trainable_dtype",
)  # fmt: skip
"""GR00TConfig fields that change only the trainable part: left out of the fingerprint."""


def cache_root(cfg: TrainConfig) -> Path:
    """The folder disk caches go into (one subfolder per fingerprint)."""
    return Path(cfg.data.prefix_cache.dir or Path(cfg.output_dir) / "prefix_cache")


def check_settings(cfg: TrainConfig, env: DistEnv) -> None:
    """Refuse settings a cache cannot serve, before anything heavy is built (exit 2 naming the setting)."""
    settings = cfg.data.prefix_cache
    if settings.mode == "off":
        return
    if env.world_size > 1 and settings.mode == "memory":
        raise ConfigError(
            SETTING, f"memory keeps the cache in one process; with {env.world_size} processes use disk"
        )
    hosts_local = int(os.environ.get("LOCAL_WORLD_SIZE", env.world_size))
    if env.world_size > hosts_local:
        raise ConfigError(
            SETTING,
            f"disk builds the cache on one host; this run has processes on {env.world_size // hosts_local}",
        )
    for name in ("tune_visual", "tune_llm"):
        if getattr(cfg.model, name):
            what = "the vision tower" if name == "tune_visual" else "the token embeddings and every LLM layer"
            raise ConfigError(
                SETTING,
                f"{settings.mode} stores the frozen prefix's output, but model.{name}=true trains {what}, "
                f"which the cache would hold fixed. Set model.{name}=false or {SETTING}=off",
            )
    if settings.variants > 1 and not cfg.data.augment:
        raise ConfigError(
            "data.prefix_cache.variants",
            f"is {settings.variants}, but data.augment is false: every variant would be the same. Set it to 1",
        )
    if settings.mode == "disk":
        refuse_dataset_folder(cfg, [(cache_root(cfg), "data.prefix_cache.dir")])


@dataclass
class PrefixCache:
    """A run's cache, opened or built, and what the run's TrainParts take from it."""

    source: CachedSource
    store: FeatureStore
    facts: dict[str, Any]
    hidden_dtype: torch.dtype

    def apply(self, parts: TrainParts, model, num_images: int, vlm_tokens: int) -> None:
        """Train `parts` from the cache: its batches, a loss continuing from them, the frozen prefix read
        from the batch (cheap: no trainable weight, so it still runs under the optimizer's update), the FLOPs
        the trainable part computes (for MFU), and the facts for summary.json."""
        dtype = self.hidden_dtype

        def frozen_prefix(batch: dict):
            hidden = dequantize(batch["prefix_hidden"], batch.get("prefix_scale"), dtype)
            features = {
                "hidden": hidden,
                "valid": batch["prefix_valid"],
                "image_mask": batch["prefix_image_mask"],
            }
            return model.prefix_from_features(features)

        def loss_fn(module, batch: dict, prefix=None) -> torch.Tensor:
            return _gr00t.gr00t_loss(module, batch, prefix if prefix is not None else frozen_prefix(batch))

        parts.data, parts.loss_fn, parts.frozen_prefix = self.source, loss_fn, frozen_prefix
        flops = gr00t_model.training_flops_per_sample(
            model.config, num_images=num_images, vlm_tokens=vlm_tokens
        )
        depth, layers = self.facts["frozen_llm_layers"], model.config.llm_num_layers
        parts.flops_per_sample = flops["train"] - flops["fwd_vision"] - flops["fwd_llm"] * depth / layers
        parts.facts["prefix_cache"] = self.facts


def open_cache(cfg: TrainConfig, env: DistEnv, model, data, processor) -> PrefixCache | None:
    """Reuse the disk cache of this run's fingerprint, or build one (in memory, or on disk); logs which.
    None when data.prefix_cache.mode is off."""
    settings = cfg.data.prefix_cache
    if settings.mode == "off":
        return None
    depth = model.frozen_depth()
    if depth is None:
        raise ConfigError(
            SETTING,
            f"{settings.mode} needs a frozen vision tower, connector and token embeddings, and this model trains "
            "one of them (model.tune_visual, model.tune_llm or model.lora's train_in_full)",
        )
    compiled = compile_like_training(cfg, env.device, model)
    started = time.perf_counter()
    inputs = {**fingerprint_inputs(cfg, env.device, model, data, processor, depth), "compiled": compiled}
    fingerprint_s = time.perf_counter() - started  # mostly hashing the frozen weights
    digest = hashlib.sha256(json.dumps(inputs, sort_keys=True, default=str).encode()).hexdigest()
    if env.broadcast_object(digest) != digest:
        raise RuntimeError(
            f"prefix cache: rank {env.rank} has other frozen weights or settings than rank 0 (fingerprint "
            f"{digest[:16]})"
        )
    meta = {"fingerprint": digest, "inputs": inputs, "variants": settings.variants, "dtype": settings.dtype}
    meta["num_samples"] = len(data.dataset)
    final = cache_root(cfg) / digest[:16] if settings.mode == "disk" else None
    reused = final is not None and (FeatureStore.read_meta(final) or {}).get("fingerprint") == digest
    reused = env.broadcast_object(reused)  # rank 0 decides for every rank
    if reused:
        store, times = FeatureStore.open(final), {"build_s": 0.0, "first_batch_s": 0.0}
        log.info("prefix cache: reusing %s (%.2f GB)", final, store.nbytes() / 1e9)
    else:
        for path in [] if final is None or not env.is_main else remove_abandoned(final.parent, digest[:16]):
            log.info("prefix cache: removed %s, a build that did not finish", path)
        _check_room(final, expected_bytes(cfg, model, processor, len(data.dataset)))
        _say_building(cfg, final, depth, len(data.dataset))
        temporary = None if final is None else final.with_name(f".tmp-{digest[:16]}-{os.getpid()}")
        temporary = env.broadcast_object(temporary)  # rank 0's: every rank writes into the same files
        progress = env.is_main and cfg.logging.progress
        try:
            store, times = build_store(cfg, model, data, processor, env, meta, temporary, progress)
            if env.is_main:
                store = store.finish(final)
            env.barrier()
            if not env.is_main and final is not None:
                store = FeatureStore.open(final)
        except BaseException:  # a half-written cache is never kept (a killed process's: the next build's)
            if temporary is not None and env.is_main:
                shutil.rmtree(temporary, ignore_errors=True)
            raise
        log.info(
            "prefix cache: built %d samples x %d variant(s) in %.1f s, %.2f GB %s",
            len(data.dataset), settings.variants, times["build_s"], store.nbytes() / 1e9,
            f"in {final}" if final else "in host memory",
        )  # fmt: skip
    source = CachedSource(
        store, batch_size=cfg.data.batch_size, seed=cfg.seed, shuffle=cfg.data.shuffle, rank=env.rank,
        world_size=env.world_size, device=env.device,
    )  # fmt: skip
    facts = {
        "mode": settings.mode, "dtype": settings.dtype, "variants": settings.variants, "fingerprint": digest,
        "folder": str(final) if final else None, "bytes": store.nbytes(), **times,
        "fingerprint_s": fingerprint_s, "reused": reused, "samples": len(data.dataset),
        "frozen_llm_layers": depth, "compiled": compiled,
    }  # fmt: skip
    return PrefixCache(source, store, facts, getattr(torch, store.meta["hidden_dtype"]))


def compile_like_training(cfg: TrainConfig, device: torch.device, model) -> bool:
    """Where optimizations.compile resolves on, the model's blocks compiled before the build (the Trainer
    finds them compiled and keeps them): the cache then holds the bits that training's own frozen prefix
    computes, compiled kernels and all. True when compiled."""
    mode = resolve_optimizations(cfg, device)[0].optimizations.compile
    if mode == "off" or (mode == "auto" and device.type != "cuda"):
        return False
    model.compile_blocks()
    return True


def expected_bytes(cfg: TrainConfig, model, processor, count: int) -> int:
    """The features' bytes a build will store (the per-sample state, action and masks add a few percent)."""
    settings = cfg.data.prefix_cache
    tokens = processor.config.vlm_seq_len * count * settings.variants
    per_token = model.config.llm_hidden_size * {"bf16": 2, "fp32": 4, "fp8": 1}[settings.dtype]
    return tokens * (per_token + (4 if settings.dtype == "fp8" else 0))


def _check_room(final: Path | None, needed: int) -> None:
    """Refuse a build that cannot fit, before it starts: host memory (MemAvailable) for mode=memory, the
    folder's free disk space for mode=disk."""
    hint = "fewer data.prefix_cache.variants or data.prefix_cache.dtype=fp8"
    if final is None:
        available = _available_memory()
        if available is not None and needed > 0.9 * available:
            raise ConfigError(
                SETTING,
                f"memory: the cache needs {needed / 1e9:.1f} GB of host memory and {available / 1e9:.1f} GB "
                f"are available; use {SETTING}=disk, or {hint}",
            )
        return
    final.parent.mkdir(parents=True, exist_ok=True)
    free = shutil.disk_usage(final.parent).free
    if needed > free:
        raise ConfigError(
            "data.prefix_cache.dir",
            f"the cache needs {needed / 1e9:.1f} GB and {final.parent} has {free / 1e9:.1f} GB free; choose "
            f"another folder, or {hint}",
        )


def _available_memory() -> int | None:
    """MemAvailable of /proc/meminfo in bytes (None where there is none)."""
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        return None
    return None


def _say_building(cfg: TrainConfig, final: Path | None, depth: int, count: int) -> None:
    settings = cfg.data.prefix_cache
    log.info(
        "prefix cache (%s, %s): computing the frozen prefix (vision tower, connector, embeddings, the first %d "
        "LLM layers) once for %d samples x %d variant(s)%s; training then reads it instead of video: "
        "optimizations.data and the decoding workers are not used for training, every other optimization "
        "runs as resolved",
        settings.mode, settings.dtype, depth, count, settings.variants,
        "" if final is None else f" into {final}",
    )  # fmt: skip
    if final is not None and final.parent.is_dir():
        others = sorted(p.name for p in final.parent.iterdir() if p.is_dir() and p.name != final.name)
        if others:
            log.info(
                "prefix cache: %s also holds caches of other inputs: %s", final.parent, ", ".join(others)
            )


def fingerprint_inputs(cfg: TrainConfig, device: torch.device, model, data, processor, depth: int) -> dict:
    """What the cached numbers depend on, as JSON-able values (their SHA-256 names the cache)."""
    found = dataset_fingerprint(data.root)
    config = {k: v for k, v in model.config.to_dict().items() if k not in TRAINING_ONLY}
    tasks = sorted(data.dataset.meta.tasks.values())
    return {
        "dataset": hashlib.sha256(json.dumps(found, sort_keys=True).encode()).hexdigest() if found else None,
        "episodes": data.train_episodes,
        "samples": len(data.dataset),
        "frozen_weights": frozen_weights_digest(model, depth),
        "frozen_llm_layers": depth,
        "model": config,
        "fp8_frozen": cfg.optimizations.fp8_frozen,
        "prompt_tokens": hashlib.sha256(
            json.dumps([processor.token_ids(t) for t in tasks]).encode()
        ).hexdigest(),
        "processor": dataclasses.asdict(processor.config),
        "image_spec": dataclasses.asdict(processor.image_spec),
        "cameras": data.camera_keys,
        "horizon": data.horizon,
        "stats": data.stats,
        "modality": data.features.modality,
        "embodiment_tag": cfg.data.embodiment_tag,
        "augment": cfg.data.augment,
        "augment_backend": cfg.data.augment_backend,
        "seed": cfg.seed if cfg.data.augment else None,  # only augmentation draws from it
        "variants": cfg.data.prefix_cache.variants,
        "dtype": cfg.data.prefix_cache.dtype,
        "device": torch.cuda.get_device_name(device) if device.type == "cuda" else device.type,
        "torch": torch.__version__,
        "gr00t_model": gr00t_model.__version__,
    }


def frozen_weights_digest(model, depth: int) -> str:
    """SHA-256 over the names, dtypes, shapes and bytes of the frozen prefix's weights."""
    prefixes = ("backbone.vision_model.", "backbone.mlp1.", "backbone.language_model.embed_tokens.")
    prefixes += tuple(f"backbone.language_model.layers.{i}." for i in range(depth))
    total = hashlib.sha256()
    for name, tensor in sorted(model.state_dict().items()):
        if not name.startswith(prefixes):
            continue
        value = tensor.detach().contiguous().cpu()
        total.update(f"{name}\0{value.dtype}\0{tuple(value.shape)}\n".encode())
        total.update(value.reshape(-1).view(torch.uint8).numpy())
    return total.hexdigest()
