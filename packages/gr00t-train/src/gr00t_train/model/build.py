"""GR00T's TrainParts: everything model- and data-specific of a run, built from the sibling packages (the
dataset and processor from `data.dataset`, the model, loss and random draws from `model.gr00t`, the batch source from the
data component). The Trainer (`_trainer.py`) trains whatever TrainParts it is given."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import gr00t_model
import torch

from .._distributed import DistEnv
from .._parts import TrainParts
from ..config.sections import TrainConfig
from ..data import dataset as _data
from ..data.component import build_source
from ..metrics.startup import clock as startup_clock
from ..prefix_cache import cache as _prefix_cache
from ..validation import held_out as _validation
from . import gr00t as _gr00t

log = logging.getLogger(__name__)
DATASET_META = "dataset_meta"
"""Checkpoint subfolder holding the modality.json (joint groups, cameras) and stats.json the run normalized
with, whatever their source (what `infer` normalizes with), and split.json: the episodes held out of training
(data.val_episodes)."""


def build_parts(cfg: TrainConfig, env: DistEnv) -> TrainParts:
    """Dataset -> vla_io Pipeline (GR00T processor in the host thread, augmentation on the device) or the
    LeRobot-style baseline loader, over the training episodes -> gr00t_model model, loss and random draws;
    the held-out episodes' samples for validation (data.val_episodes, eval.every). A data.mixture: the same
    per member (`model.build_mixture`)."""
    if cfg.data.mixture:
        from .build_mixture import build_mixture_parts

        return build_mixture_parts(cfg, env)
    plan = _data.plan_data(cfg)  # metadata only: a dataset that cannot be mapped stops before the model
    split = _data.plan_split(cfg, plan)  # so does a split that leaves nothing to train on
    _prefix_cache.check_settings(cfg, env)  # data.prefix_cache: settings a cache cannot serve
    facts, tokenizer, model = build_model_parts(cfg, env)
    data = _data.open_dataset(
        cfg, model_horizon=model.config.action_horizon, progress=env.is_main, plan=plan, split=split
    )
    processor = _data.make_processor(data, model.config, tokenizer, vlm_seq_len=cfg.model.vlm_seq_len)
    vlm_tokens = processor.config.vlm_seq_len
    flops, tokens = _gr00t.flops_and_tokens(model.config, len(data.camera_keys), vlm_tokens)
    cache = _prefix_cache.open_cache(cfg, env, model, data, processor)  # None unless data.prefix_cache is on
    source = (
        cache.source if cache else build_source(cfg, env, data, processor, check_first=model.validate_batch)
    )
    log.info(
        "model %s (%.1f M trainable parameters), %d camera(s) %s, %d VLM tokens, action chunk %d; "
        "%d samples per epoch; state %s, action %s (groups from %s)",
        cfg.model.preset,
        sum(p.numel() for p in model.parameters() if p.requires_grad) / 1e6,
        len(data.camera_keys),
        data.camera_keys,
        vlm_tokens,
        data.horizon,
        len(data.dataset),
        list(data.features.modality["state"]),
        list(data.features.modality["action"]),
        data.features.source,
    )
    save = lambda module, folder: save_dataset_meta(module, folder, data)  # noqa: E731
    parts = model_parts(cfg, env, model, source, save, flops, tokens)
    parts.validation = _validation.load_held_out(cfg, env, data, processor, model)
    parts.base = _gr00t.base_weights(model)
    parts.facts = {**facts, "validation_split": split.facts(), **startup_facts()}
    if cache is not None:  # batches, loss and MFU's FLOPs from the stored features
        cache.apply(parts, model, len(data.camera_keys), vlm_tokens)
    return parts


def build_model_parts(cfg: TrainConfig, env: DistEnv) -> tuple[dict, object, gr00t_model.GR00TN16]:
    """The start-up facts, the tokenizer and the model, each a part of start-up's model phase
    (metrics.startup.MODEL_PARTS), which ends here; the dataset's metadata was planned before."""
    startup_clock.part("data_plan")
    _gr00t.import_model_modules(cfg, env.device)
    startup_clock.part("imports")
    facts = _gr00t.start_facts(cfg)  # random weights or the test tokenizer on a large preset: said now
    startup_clock.part("start_facts")
    tokenizer = gr00t_model.load_tokenizer(_gr00t.tokenizer_path(cfg))
    startup_clock.part("tokenizer")
    model = _gr00t.build_model(cfg, env.device, tokenizer)
    startup_clock.mark("model")
    return facts, tokenizer, model


def startup_facts() -> dict:
    """summary.json's `startup_model_parts` (seconds per part of the model phase), once the phase is done."""
    parts = startup_clock.ordered_parts("model")
    return {"startup_model_parts": parts} if parts else {}


def save_dataset_meta(module: torch.nn.Module, folder: Path, data) -> None:
    """The model, and beside it the modality.json and stats.json the run normalized with (what `infer`
    normalizes with): what was used, never a copy of the dataset's files (which may not exist)."""
    _gr00t.save_model(module, folder)
    meta = folder / DATASET_META
    meta.mkdir()
    for name, content in data.dataset_meta().items():
        (meta / name).write_text(json.dumps(content, indent=2) + "\n")


def model_parts(cfg: TrainConfig, env: DistEnv, model, source, save, flops, tokens) -> TrainParts:
    """TrainParts of a GR00T model fed by `source`."""
    return TrainParts(
        model=model,
        loss_fn=_gr00t.gr00t_loss,
        data=source,
        save_model=save,
        load_model=_gr00t.load_model_in_place,
        flops_per_sample=flops,
        tokens_per_sample=tokens,
        draw=_gr00t.make_draw(model, cfg.data.batch_size, env.device),
        frozen_prefix=model.frozen_prefix,
        compile_model=model.compile_blocks,
        update_stages=model.repeated_blocks,  # the frozen ones hold nothing to stage and are left out
        row_tables=(_gr00t.embodiment_tables(model), "embodiment_id"),
    )
