"""save_pretrained / from_pretrained: our layout (bit-exact round trip) and the release's layout.

A checkpoint directory holds `config.json` and `model.safetensors` (or `model-0000k-of-0000n.safetensors`
shards with `model.safetensors.index.json`). Our config.json is {"format": "gr00t_model", "config": {...}};
the release's has model_type "Gr00tN1d6" and only action-head fields (backbone sizes then come from the
n1.6-3b preset or the `config` you pass).
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import torch

from ._config import GR00TConfig
from ._official import (
    config_from_official,
    config_to_official,
    from_official_name,
    is_official_config,
    to_official_name,
)

log = logging.getLogger(__name__)
FORMAT = "gr00t_model"
INDEX = "model.safetensors.index.json"


@dataclass
class LoadReport:
    """What from_pretrained matched: `missing` (ours, left at init), `unexpected` (file names we do not know),
    `ignored` (release tensors we deliberately never build: LM head, vision pooling head, dropped LLM layers)."""

    layout: str
    loaded: int = 0
    missing: list[str] = field(default_factory=list)
    unexpected: list[str] = field(default_factory=list)
    ignored: list[str] = field(default_factory=list)

    def __str__(self) -> str:
        def few(names: list[str]) -> str:
            return ", ".join(names[:8]) + (f", ... ({len(names)} in all)" if len(names) > 8 else "")

        lines = [f"{self.layout} checkpoint: {self.loaded} tensors loaded"]
        for label, names in (
            ("missing", self.missing),
            ("unexpected", self.unexpected),
            ("ignored", self.ignored),
        ):
            if names:
                lines.append(f"  {label} ({len(names)}): {few(names)}")
        return "\n".join(lines)


def save_pretrained(
    model: torch.nn.Module, path: str | os.PathLike, *, layout: str = FORMAT, max_shard_bytes: int = 4 << 30
) -> Path:
    """Write config.json + safetensors shards (each file to a temporary name, then renamed).

    layout="gr00t_model" (default) keeps our names and every tensor's dtype, so from_pretrained restores it
    bit-exactly; layout="official" writes the release's names and config.json fields.
    """
    from safetensors.torch import save_file

    if layout not in (FORMAT, "official"):
        raise ValueError(f"layout must be {FORMAT!r} or 'official', got {layout!r}")
    config: GR00TConfig = model.config
    lora = getattr(model, "lora_config", None)
    if lora is not None and layout == "official":
        raise ValueError(
            "the release's layout has no LoRA adapters: merge them first (gr00t_model.merge_lora)"
        )
    meta = (  # first: a config the layout cannot describe fails before any file is written
        config_to_official(config)
        if layout == "official"
        else {"format": FORMAT, "format_version": 1, "config": config.to_dict()}
    )
    if lora is not None:  # from_pretrained puts the same adapters on before loading their tensors
        meta["lora"] = lora
    out = Path(path)
    out.mkdir(parents=True, exist_ok=True)
    rename = to_official_name if layout == "official" else (lambda n: n)
    tensors = {rename(n): p.detach().contiguous().cpu() for n, p in model.state_dict().items()}
    shards = list(_shard(tensors, max_shard_bytes))
    names = (
        ["model.safetensors"]
        if len(shards) == 1
        else [f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors" for i in range(len(shards))]
    )
    for name, shard in zip(names, shards):
        _atomic(out / name, lambda tmp, shard=shard: save_file(shard, str(tmp), metadata={"format": "pt"}))
    if len(shards) > 1:
        index = {
            "metadata": {"total_size": sum(_nbytes(t) for t in tensors.values())},
            "weight_map": {k: n for n, s in zip(names, shards) for k in s},
        }
        _atomic(out / INDEX, lambda tmp: tmp.write_text(json.dumps(index, indent=2, sort_keys=True)))
    else:
        (out / INDEX).unlink(missing_ok=True)
    _atomic(out / "config.json", lambda tmp: tmp.write_text(json.dumps(meta, indent=2)))
    return out


def from_pretrained(
    path: str | os.PathLike,
    *,
    config: GR00TConfig | None = None,
    device: str | torch.device = "cpu",
    strict: bool = False,
    return_report: bool = False,
    **overrides,
):
    """Load a model saved by save_pretrained or a release checkpoint directory (config.json + safetensors).

    `config` replaces the stored config (our layout) or the backbone base (release layout); `overrides`
    change single fields afterwards (e.g. tune_top_llm_layers=0). Missing and unexpected keys are logged;
    strict=True raises on either. Returns the model, or (model, LoadReport) with return_report=True.
    """
    from ._lora import add_lora
    from ._model import GR00TN16

    root = Path(path)
    meta = _read_json(root / "config.json")
    if meta.get("format") == FORMAT:
        layout, cfg = FORMAT, config or GR00TConfig.from_dict(meta["config"])
    elif is_official_config(meta):
        layout, cfg = "official", config_from_official(meta, base=config)
    else:
        raise ValueError(
            f"{root / 'config.json'}: neither a gr00t_model checkpoint nor a release (model_type Gr00tN1d6) config"
        )
    cfg = cfg.replace(**overrides) if overrides else cfg
    files = _weight_files(root)
    names = _file_keys(files)
    report = LoadReport(layout)
    mapped: dict[str, tuple[str, Path]] = {}
    for name, file in names.items():
        ours = name if layout == FORMAT else from_official_name(name, cfg.llm_num_layers)
        if ours is None:
            report.ignored.append(name)
        else:
            mapped[ours] = (name, file)
    lora = meta.get("lora") if layout == FORMAT else None

    def build(where: str | torch.device) -> GR00TN16:
        with torch.device(where):
            built = GR00TN16(cfg)
        if lora:
            add_lora(
                built, lora["rank"], lora["alpha"], lora["dropout"], lora["targets"], only=lora["modules"]
            )
        return built

    skeleton = build("meta")  # the expected tensors, and the model itself when the files provide them all
    expected = dict(skeleton.state_dict())
    report.unexpected = sorted(k for k in mapped if k not in expected)
    report.missing = sorted(k for k in expected if k not in mapped)
    if strict and (report.missing or report.unexpected):
        raise KeyError(f"{root}: strict load failed\n{report}")
    # Everything present: skip random initialisation (the model has no buffers to recompute).
    if report.missing:
        model = build(device)
    else:
        model = skeleton.to_empty(device=device)
    report.loaded = _copy_in(model, expected, mapped)
    log.info("%s", report)
    if report.missing or report.unexpected:
        log.warning(
            "%s: %d missing, %d unexpected keys (see LoadReport)",
            root,
            len(report.missing),
            len(report.unexpected),
        )
    return (model, report) if return_report else model


def _copy_in(model: torch.nn.Module, expected: dict, mapped: dict[str, tuple[str, Path]]) -> int:
    from safetensors import safe_open

    params = dict(model.state_dict(keep_vars=True))
    by_file: dict[Path, list[tuple[str, str]]] = {}
    for ours, (theirs, file) in mapped.items():
        if ours in expected:
            by_file.setdefault(file, []).append((ours, theirs))
    loaded = 0
    with torch.no_grad():
        for file, pairs in by_file.items():
            with safe_open(str(file), framework="pt") as reader:
                for ours, theirs in pairs:
                    tensor, target = reader.get_tensor(theirs), params[ours]
                    if tuple(tensor.shape) != tuple(target.shape):
                        raise ValueError(
                            f"{file.name}: {theirs} has shape {tuple(tensor.shape)}, model expects {tuple(target.shape)} ({ours})"
                        )
                    target.copy_(tensor)
                    loaded += 1
    return loaded


def _weight_files(root: Path) -> list[Path]:
    if (root / INDEX).exists():
        index = _read_json(root / INDEX)
        files = sorted({root / f for f in index.get("weight_map", {}).values()})
    else:
        files = sorted(root.glob("*.safetensors"))
    absent = [f for f in files if not f.exists()]
    if absent or not files:
        raise FileNotFoundError(
            f"{root}: safetensors weights missing ({', '.join(map(str, absent)) or 'no *.safetensors'})"
        )
    return files


def _file_keys(files: list[Path]) -> dict[str, Path]:
    from safetensors import safe_open

    keys: dict[str, Path] = {}
    for file in files:
        with safe_open(str(file), framework="pt") as reader:
            for key in reader.keys():  # noqa: SIM118 (safe_open is not a dict)
                if key in keys:
                    raise ValueError(f"tensor {key} appears in both {keys[key].name} and {file.name}")
                keys[key] = file
    return keys


def _read_json(path: Path) -> dict:
    if not path.exists():
        raise FileNotFoundError(f"{path} not found (a checkpoint directory needs config.json)")
    try:
        return json.loads(path.read_text())
    except json.JSONDecodeError as err:
        raise ValueError(f"{path}: invalid JSON ({err})") from err


def _nbytes(t: torch.Tensor) -> int:
    return t.numel() * t.element_size()


def _shard(tensors: dict[str, torch.Tensor], limit: int) -> Iterator[dict[str, torch.Tensor]]:
    shard: dict[str, torch.Tensor] = {}
    size = 0
    for name, tensor in tensors.items():
        if shard and size + _nbytes(tensor) > limit:
            yield shard
            shard, size = {}, 0
        shard[name] = tensor
        size += _nbytes(tensor)
    yield shard


def _atomic(target: Path, write) -> None:
    tmp = target.with_name(target.name + ".tmp")
    write(tmp)
    os.replace(tmp, target)
