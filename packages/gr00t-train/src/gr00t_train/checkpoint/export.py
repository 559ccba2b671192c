"""`gr00t-train export CHECKPOINT OUT`: a checkpoint as a complete model folder, for inference or sharing.

A checkpoint holds only what training changed (`checkpoint/weights.py`); the export is the whole model, rebuilt from
its base, the tensors it wrote and the optimizer's fp32 masters (`checkpoint/restore.py`), written by
`gr00t_model.save_pretrained` in the dtypes the run trained with, so `gr00t_model.from_pretrained(OUT)` loads
it alone. Beside it: dataset_meta/ (the statistics and joint groups to normalize with) and train_config.json
(the tokenizer and data settings `gr00t-train infer` reads), export.json naming the source, and a manifest.
The folder appears complete or not at all (written under a temporary name, then renamed)."""

from __future__ import annotations

import json
import logging
import os
import shutil
from pathlib import Path

import gr00t_model

from .._errors import DataError
from ..model.build import DATASET_META
from .checkpointer import TRAIN_CONFIG, TRAINER_STATE
from .manifest import write_manifest
from .restore import BaseError, load_pretrained

log = logging.getLogger(__name__)
EXPORTED = "export.json"
"""Marks an exported folder (and names the checkpoint it came from)."""


def export(checkpoint: str | Path, out: str | Path, *, lora_only: bool = False) -> Path:
    """Write the model of `checkpoint` (a checkpoint folder, or the newest intact one in a folder of them)
    into `out`, which must not exist yet (or be empty); returns `out`. LoRA adapters are merged into the
    weights; with `lora_only`, only the adapters are written (gr00t_model.save_lora)."""
    from ..validation.infer import find_checkpoint

    folder = find_checkpoint(checkpoint)
    out = Path(out)
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise DataError(f"OUT: {out} exists and is not an empty folder; choose a new one")
    try:
        model, report = load_pretrained(folder)
    except BaseError as err:
        raise DataError(f"CHECKPOINT: {err}") from None
    if report.missing:
        raise DataError(
            f"CHECKPOINT: {folder} does not provide {len(report.missing)} tensors: {report.missing[:5]}"
        )
    has_lora = getattr(model, "lora_config", None) is not None
    if lora_only and not has_lora:
        raise DataError(f"--lora-only: {folder} has no LoRA adapters (its run set no model.lora.rank)")
    tmp = out.with_name(f".{out.name}.tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    try:
        if lora_only:
            gr00t_model.save_lora(model, tmp)
        else:
            if has_lora:
                log.info("merged %d LoRA adapters into the weights", gr00t_model.merge_lora(model))
            gr00t_model.save_pretrained(model, tmp)
        for name in (DATASET_META, TRAIN_CONFIG):
            source = folder / name
            if source.is_dir():
                shutil.copytree(source, tmp / name)
            elif source.is_file():
                shutil.copy2(source, tmp / name)
        step = (
            json.loads((folder / TRAINER_STATE).read_text()).get("step")
            if (folder / TRAINER_STATE).is_file()
            else None
        )
        (tmp / EXPORTED).write_text(
            json.dumps({"checkpoint": str(folder.resolve()), "step": step}, indent=2) + "\n"
        )
        write_manifest(tmp, {"exported_from": str(folder.resolve())})
        if out.exists():
            out.rmdir()  # empty, checked above
        os.rename(tmp, out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    size = sum(p.stat().st_size for p in out.rglob("*") if p.is_file())
    log.info("exported %s to %s (%.1f MB, loads with gr00t_model.from_pretrained)", folder, out, size / 1e6)
    return out


def is_export(folder: Path) -> bool:
    """Whether `folder` was written by `export`."""
    return (Path(folder) / EXPORTED).is_file()
