"""Everything model- and data-specific of a run, built from the sibling packages into TrainParts."""

from __future__ import annotations

import logging
import shutil
from pathlib import Path

import gr00t_model
import torch

from . import _data, _gr00t
from ._config import TrainConfig
from ._distributed import DistEnv
from ._errors import DataError
from ._parts import TrainParts

log = logging.getLogger(__name__)
DATASET_META = "dataset_meta"
"""Checkpoint subfolder holding the dataset's modality.json and stats.json (what `infer` normalizes with)."""


def build_parts(cfg: TrainConfig, env: DistEnv) -> TrainParts:
    """Dataset -> vla_io Pipeline (GR00T processor in the host thread, augmentation on the device) ->
    gr00t_model model, loss and random draws."""
    import vla_io

    tokenizer = gr00t_model.load_tokenizer(cfg.model.tokenizer)
    model = _gr00t.build_model(cfg, env.device, tokenizer)
    data = _data.open_dataset(cfg, model_horizon=model.config.action_horizon, progress=env.is_main)
    processor = _data.make_processor(
        data,
        model.config,
        tokenizer,
        augment_on_device=cfg.data.augment,
        vlm_seq_len=cfg.model.vlm_seq_len,
    )
    pipeline = vla_io.Pipeline(
        data.dataset,
        cfg.data.batch_size,
        transform=_data.host_transform(data, processor),
        device_transform=_data.device_augment(processor, cfg.data.augment),
        num_workers=cfg.data.num_workers,
        prefetch_per_worker=cfg.data.prefetch,
        seed=cfg.seed,
        rank=env.rank,
        world_size=env.world_size,
        shuffle=cfg.data.shuffle,
        device=str(env.device),
        synchronous=cfg.optimizations.data == "sync",
        timeout_s=cfg.data.worker_timeout_s,
        skip_bad_samples=True,  # counted against data.max_bad_fraction by the loop
        **({"start_method": "spawn"} if cfg.data.decode_device == "cuda" else {}),
    )
    if len(pipeline) == 0:
        raise DataError(
            f"data.batch_size: dataset {data.root} has {len(data.dataset)} samples, fewer than one batch of "
            f"{cfg.data.batch_size} per rank on {env.world_size} rank(s)"
        )
    vlm_tokens = processor.config.vlm_seq_len
    flops, tokens = _gr00t.flops_and_tokens(model.config, len(data.camera_keys), vlm_tokens)
    log.info(
        "model %s (%.1f M trainable parameters), %d camera(s) %s, %d VLM tokens, action chunk %d; "
        "%d samples, %d batches per epoch per rank",
        cfg.model.preset,
        sum(p.numel() for p in model.parameters() if p.requires_grad) / 1e6,
        len(data.camera_keys),
        data.camera_keys,
        vlm_tokens,
        data.horizon,
        len(data.dataset),
        len(pipeline),
    )

    def save(module: torch.nn.Module, folder: Path) -> None:
        _gr00t.save_model(module, folder)
        meta = folder / DATASET_META
        meta.mkdir()
        for name in ("modality.json", "stats.json"):
            shutil.copy2(data.root / "meta" / name, meta / name)

    return TrainParts(
        model=model,
        loss_fn=_gr00t.gr00t_loss,
        data=_data.PipelineSource(pipeline, check_first=model.validate_batch),
        save_model=save,
        load_model=_gr00t.load_model_in_place,
        flops_per_sample=flops,
        tokens_per_sample=tokens,
        draw=_gr00t.make_draw(model, cfg.data.batch_size, env.device),
    )
