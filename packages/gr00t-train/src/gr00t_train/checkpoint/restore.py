"""A complete GR00T model from a folder, whatever wrote it: a release or `save_pretrained` folder (as
gr00t_model loads it), or one of our checkpoints, which holds only what its base and its optimizer state do
not (`weights.json`, `checkpoint/weights.py`). For those: the base loaded first (checked against the recorded digests;
itself resolved the same way), then the tensors the checkpoint wrote, then the trainable parameters set from
the fp32 masters of its optimizer.pt (memory-mapped: only the masters are read), cast to each parameter's
dtype as the optimizer casts them. What `infer`, `export` and a run from `model.checkpoint` load."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import gr00t_model
import torch
from gr00t_model import GR00TConfig

from .base import find_base
from .weights import read_record


class BaseError(ValueError):
    """A checkpoint's base is missing or changed (the message names the file)."""


def load_pretrained(folder: str | Path, *, device: str | torch.device = "cpu", **overrides: Any):
    """(model, LoadReport) of `folder` with GR00TConfig `overrides`; tensors no source provides are in the
    report's `missing` (left at their initialization, as gr00t_model.from_pretrained leaves them)."""
    folder = Path(folder)
    record = read_record(folder)
    if record is None:
        return gr00t_model.from_pretrained(folder, device=device, return_report=True, **overrides)
    meta = json.loads((folder / "config.json").read_text())
    config = GR00TConfig.from_dict(meta["config"]).replace(**overrides)
    fields = {f.name: getattr(config, f.name) for f in dataclasses.fields(config)}
    base = record.get("base")
    if base is None:  # a run from random weights: every frozen tensor was written
        from gr00t_model import GR00TN16, LoadReport

        with torch.device(device):
            model = GR00TN16(config)
        report = LoadReport("gr00t_train checkpoint", missing=sorted(model.state_dict()))
    else:
        where, reason = find_base(base)
        if reason is not None:
            raise BaseError(
                f"{folder} holds only what training changed; its frozen weights are those of its base "
                f"{base['path']} (recorded by path and SHA-256), but {reason}. Restore that folder"
            )
        model, report = load_pretrained(where, device=device, **fields)
    lora = meta.get("lora")
    if lora:  # the run's adapters, on the base's weights, before their tensors are loaded
        gr00t_model.add_lora(
            model, lora["rank"], lora["alpha"], lora["dropout"], lora["targets"], only=lora["modules"]
        )
    written = _written(folder)
    with torch.no_grad():
        result = model.load_state_dict(written, strict=False)
    _set_from_masters(model, folder, record["from_optimizer"]["params"])
    taken = set(record["from_optimizer"]["keys"])
    report.missing = sorted((set(report.missing) & set(result.missing_keys)) - taken)
    report.loaded += len(written) + len(taken)
    report.layout = "gr00t_train checkpoint"
    return model, report


def _written(folder: Path) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    state: dict[str, torch.Tensor] = {}
    for file in sorted(folder.glob("*.safetensors")):
        state.update(load_file(str(file)))
    return state


def _set_from_masters(model: torch.nn.Module, folder: Path, names: list[str]) -> None:
    """Set the named parameters to their fp32 masters in folder/optimizer.pt."""
    if not names:
        return
    optimizer = torch.load(folder / "optimizer.pt", map_location="cpu", weights_only=True, mmap=True)
    params = dict(model.named_parameters())
    with torch.no_grad():
        for name in names:
            master = optimizer["state"][name]["master"]
            if master.numel() != params[name].numel():
                raise ValueError(
                    f"{folder / 'optimizer.pt'}: the master of {name} has {master.numel()} elements, the "
                    f"model's parameter {params[name].numel()}"
                )
            params[name].copy_(master.reshape(params[name].shape))
