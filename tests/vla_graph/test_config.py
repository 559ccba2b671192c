from __future__ import annotations

import pytest
from vla_graph import GraphConfig


def test_defaults_are_valid() -> None:
    config = GraphConfig()
    assert config.mode == "per_microbatch" and config.warmup_iters == 3 and config.fallback == "error"


@pytest.mark.parametrize(
    ("field", "value", "words"),
    [
        ("mode", "graphs", "eager, full_iteration, per_microbatch"),
        ("warmup_iters", 0, ">= 1"),
        ("warmup_iters", True, ">= 1"),
        ("check", "yes", "True or False"),
        ("on_shape_change", "pad", "error, recapture"),
        ("max_captures", 0, ">= 1"),
        ("fallback", "cpu", "error, eager"),
        ("capture_error_mode", "strict", "global, thread_local, relaxed"),
    ],
)
def test_bad_values_name_the_field_and_the_choices(field: str, value: object, words: str) -> None:
    with pytest.raises(ValueError, match=rf"GraphConfig\.{field}=") as info:
        GraphConfig(**{field: value})
    assert words in str(info.value)


def test_fields_are_keyword_only() -> None:
    with pytest.raises(TypeError):
        GraphConfig("eager")  # type: ignore[misc]
