"""Typed coercion of config values: one function turns TOML/YAML values or command-line strings into the
type a dataclass field declares, with an error that names the field and the allowed values."""

from __future__ import annotations

import dataclasses
import functools
import json
import math
import types
import typing
from typing import Any, ClassVar, Literal, Union

from .._errors import ConfigError

_TRUE = {"true", "1", "yes", "on"}
_FALSE = {"false", "0", "no", "off"}
_NONE = {"none", "null", "~", ""}


@functools.cache
def field_types(cls: type) -> dict[str, Any]:
    """Resolved type hints of a dataclass's fields."""
    hints = typing.get_type_hints(cls)
    return {f.name: hints[f.name] for f in dataclasses.fields(cls)}


def coerce(value: Any, hint: Any, name: str) -> Any:
    """`value` converted to `hint` (a string from the command line is parsed); ConfigError otherwise."""
    origin = typing.get_origin(hint)
    args = typing.get_args(hint)
    if origin is Literal:
        if {"on", "off"} <= set(args) and (isinstance(value, bool) or str(value).lower() in _TRUE | _FALSE):
            value = "on" if _as_bool(value if isinstance(value, bool) else str(value), name) else "off"
        if value not in args:
            allowed = ", ".join(map(str, args))
            raise ConfigError(name, f"{value!r} is not one of the allowed values: {allowed}")
        return value
    if origin in (Union, types.UnionType):
        inner = [a for a in args if a is not type(None)]
        if type(None) in args and (value is None or (isinstance(value, str) and value.lower() in _NONE)):
            return None
        if len(inner) == 1:
            return coerce(value, inner[0], name)
        raise ConfigError(name, f"unsupported union type {hint}")
    if origin in (list, tuple):
        items = _as_sequence(value, name)
        if origin is tuple and args and args[-1] is not Ellipsis:
            if len(items) != len(args):
                raise ConfigError(name, f"expected {len(args)} values, got {len(items)}: {value!r}")
            return tuple(coerce(v, a, f"{name}[{i}]") for i, (v, a) in enumerate(zip(items, args)))
        item_type = args[0] if args else Any
        out = [coerce(v, item_type, f"{name}[{i}]") for i, v in enumerate(items)]
        return tuple(out) if origin is tuple else out
    if dataclasses.is_dataclass(hint):  # a section inside a list (data.mixture's entries)
        if isinstance(value, hint):
            return value
        from .io import config_from_dict

        try:
            return config_from_dict(hint, value)
        except ConfigError as err:
            raise err.within(name) from None
    if hint is Any:
        return value
    if hint is bool:
        return _as_bool(value, name)
    if hint is int:
        return _as_number(value, int, name)
    if hint is float:
        return _as_number(value, float, name)
    if hint is str:
        if not isinstance(value, str):
            raise ConfigError(name, f"expected a string, got {value!r}")
        return value
    raise ConfigError(name, f"unsupported field type {hint}")


def _as_bool(value: Any, name: str) -> bool:
    if isinstance(value, bool):
        return value
    if isinstance(value, str) and value.lower() in _TRUE | _FALSE:
        return value.lower() in _TRUE
    raise ConfigError(name, f"expected true or false, got {value!r}")


def _as_number(value: Any, kind: type, name: str) -> Any:
    what = "an integer" if kind is int else "a number"
    if isinstance(value, bool):
        raise ConfigError(name, f"expected {what}, got a boolean {value!r}")
    if isinstance(value, str):
        try:
            value = int(value) if kind is int and value.strip().lstrip("+-").isdigit() else float(value)
        except ValueError:
            raise ConfigError(name, f"expected {what}, got {value!r}") from None
    if kind is int and isinstance(value, float) and value.is_integer():
        value = int(value)
    if (kind is int and not isinstance(value, int)) or not isinstance(value, (int, float)):
        raise ConfigError(name, f"expected {what}, got {value!r}")
    if not math.isfinite(value):  # nan and inf pass every `>` range check, so refuse them here
        raise ConfigError(name, f"expected a finite number, got {value!r}")
    return kind(value)


def _as_sequence(value: Any, name: str) -> list:
    if isinstance(value, (list, tuple)):
        return list(value)
    if isinstance(value, str):
        text = value.strip()
        if text.startswith("["):
            try:
                return list(json.loads(text))
            except json.JSONDecodeError:
                text = text[1:-1] if text.endswith("]") else text[1:]
        return [part.strip() for part in text.split(",") if part.strip()]
    raise ConfigError(name, f"expected a list, got {value!r}")


def check_fields(obj: Any) -> None:
    """Validate (and normalise in place) every field of a config dataclass against its declared type."""
    for name, hint in field_types(type(obj)).items():
        value = getattr(obj, name)
        if dataclasses.is_dataclass(hint):
            if not isinstance(value, hint):
                raise ConfigError(name, f"expected a {hint.__name__} section, got {type(value).__name__}")
            continue
        object.__setattr__(obj, name, coerce(value, hint, name))


def require(condition: bool, name: str, message: str) -> None:
    """Raise ConfigError(name, message) unless `condition` holds."""
    if not condition:
        raise ConfigError(name, message)


class Section:
    """A config section: type-checks all fields on construction, then runs the section's own range checks."""

    renamed_fields: ClassVar[dict[str, str]] = {}
    """Former field names still accepted when a config is read (old name -> current name)."""

    def __post_init__(self) -> None:
        check_fields(self)
        self._check()

    def _check(self) -> None:
        pass
