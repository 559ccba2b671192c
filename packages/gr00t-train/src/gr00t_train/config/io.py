"""Config files (TOML, YAML, JSON), `--set key=value` overrides and the resolved JSON written with a run."""

from __future__ import annotations

import copy
import dataclasses
import json
import logging
import sys
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any, TypeVar

from .._errors import ConfigError
from .sections import TrainConfig
from .types import coerce, field_types

T = TypeVar("T")
log = logging.getLogger(__name__)


def config_to_dict(cfg: Any) -> dict[str, Any]:
    """A plain, JSON-ready dict of a config (tuples become lists)."""
    return json.loads(json.dumps(dataclasses.asdict(cfg)))


def config_from_dict(cls: type[T], data: Mapping[str, Any], base: T | None = None) -> T:
    """Build `cls` from a nested mapping, starting from `base` (or the defaults). Unknown keys are errors."""
    if not isinstance(data, Mapping):
        raise ConfigError("", f"expected a table of settings, got {type(data).__name__}")
    data = _current_names(cls, data)
    hints = field_types(cls)
    unknown = sorted(set(data) - set(hints))
    if unknown:
        raise ConfigError(unknown[0], f"unknown setting; allowed here: {', '.join(sorted(hints))}")
    values = {}
    for name, hint in hints.items():
        current = getattr(base, name) if base is not None else None
        if name not in data:
            if base is not None:
                values[name] = copy.deepcopy(current)
            continue
        try:
            if dataclasses.is_dataclass(hint):
                values[name] = config_from_dict(hint, data[name], current)
            else:
                values[name] = coerce(data[name], hint, name)
        except ConfigError as err:
            raise (err.within(name) if dataclasses.is_dataclass(hint) else err) from None
    return cls(**values)


def _current_names(cls: type, data: Mapping[str, Any]) -> Mapping[str, Any]:
    """`data` with former field names (a section's `renamed_fields`) under their current names, so configs and
    checkpoints written before a rename still load."""
    renamed = getattr(cls, "renamed_fields", {})
    if not any(old in data for old in renamed):
        return data
    current = dict(data)
    for old, new in renamed.items():
        if old in current:
            if new in current:
                raise ConfigError(new, f"given twice: as {new} and under its former name {old}")
            log.warning("config setting %s is now called %s; read as such", old, new)
            current[new] = current.pop(old)
    return current


def read_config_file(path: str | Path) -> dict[str, Any]:
    """The settings of a .toml, .yaml/.yml or .json file, as a nested dict."""
    path = Path(path)
    if not path.is_file():
        raise ConfigError("", f"config file not found: {path}")
    suffix = path.suffix.lower()
    if suffix not in (".toml", ".yaml", ".yml", ".json"):
        raise ConfigError("", f"{path}: unknown config format {suffix!r}; use .toml, .yaml, .yml or .json")
    try:
        raw = path.read_bytes()
    except OSError as err:
        raise ConfigError("", f"{path}: cannot read: {err.strerror}") from None
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as err:
        line = raw.count(b"\n", 0, err.start) + 1
        column = err.start - (raw.rfind(b"\n", 0, err.start) + 1) + 1
        raise ConfigError(
            "", f"{path}: not UTF-8 text: byte 0x{raw[err.start]:02x} at line {line}, column {column}"
        ) from None
    try:
        if suffix == ".toml":
            data = _toml().loads(text)
        elif suffix in (".yaml", ".yml"):
            import yaml

            try:
                data = yaml.safe_load(text) or {}
            except yaml.YAMLError as err:
                raise ConfigError("", f"{path}: cannot parse: {_yaml_problem(err)}") from None
        else:
            data = json.loads(text)
    except ConfigError:
        raise
    except (ValueError, ImportError) as err:  # tomllib and json name the line and column themselves
        raise ConfigError("", f"{path}: cannot parse: {err}") from err
    if not isinstance(data, dict):
        raise ConfigError("", f"{path}: expected a table of settings at the top level")
    return data


def _yaml_problem(err: Exception) -> str:
    """PyYAML's error in one line, with the 1-based line and column of the problem."""
    mark = getattr(err, "problem_mark", None) or getattr(err, "context_mark", None)
    problem = getattr(err, "problem", None) or str(err).splitlines()[0]
    context = getattr(err, "context", None)
    where = f"line {mark.line + 1}, column {mark.column + 1}: " if mark is not None else ""
    return f"{where}{problem}" + (f" ({context})" if context else "")


def _toml():
    if sys.version_info >= (3, 11):
        import tomllib

        return tomllib
    import tomli

    return tomli


def parse_overrides(pairs: Iterable[str]) -> dict[str, Any]:
    """`["optim.lr=3e-4", "data.cameras=front,wrist"]` -> a nested dict of raw strings."""
    nested: dict[str, Any] = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        key = key.strip()
        if not sep or not key:
            raise ConfigError("", f"override {pair!r} must look like section.field=value")
        node = nested
        parts = key.split(".")
        for part in parts[:-1]:
            child = node.setdefault(part, {})
            if not isinstance(child, dict):
                raise ConfigError(key, f"{part} is both a value and a section in the overrides")
            node = child
        node[parts[-1]] = value
    return nested


def apply_overrides(cfg: TrainConfig, pairs: Iterable[str]) -> TrainConfig:
    """A copy of `cfg` with `section.field=value` overrides applied (values parsed by the field's type)."""
    return config_from_dict(TrainConfig, parse_overrides(pairs), base=cfg)


def load_config(
    path: str | Path | None = None, *, preset: str | None = None, overrides: Iterable[str] = ()
) -> TrainConfig:
    """The resolved config: preset (or defaults), then the file, then the overrides.

    A file may name its starting preset with a top-level `preset = "libero"` entry."""
    from .presets import preset_config

    data = read_config_file(path) if path is not None else {}
    file_preset = data.pop("preset", None)
    if preset is not None and file_preset is not None and preset != file_preset:
        raise ConfigError("preset", f"the command line says {preset!r} but {path} says {file_preset!r}")
    name = preset or file_preset
    base = preset_config(name) if name else TrainConfig()
    cfg = config_from_dict(TrainConfig, data, base=base)
    return apply_overrides(cfg, overrides)


def write_config_json(cfg: TrainConfig, path: str | Path) -> Path:
    """Write the resolved config as JSON (what `--config` accepts back)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(config_to_dict(cfg), indent=2) + "\n")
    return path
