"""OverlapConfig validation: errors name the field and the allowed values."""

from __future__ import annotations

import pytest
import torch
from vla_overlap import OverlapConfig


def test_defaults_overlap_everything() -> None:
    config = OverlapConfig()
    assert config.overlap_grad_reduce and config.overlap_param_gather
    assert config.grad_reduce_dtype is torch.float32 and config.bucket_elements == 40_000_000


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"bucket_elements": 0}, "bucket_elements must be a positive int"),
        ({"bucket_elements": True}, "bucket_elements must be a positive int"),
        ({"bucket_elements": 2.5}, "bucket_elements must be a positive int"),
        ({"overlap_grad_reduce": 1}, "overlap_grad_reduce must be True or False"),
        ({"overlap_param_gather": "yes"}, "overlap_param_gather must be True or False"),
        ({"allow_unused_params": None}, "allow_unused_params must be True or False"),
        ({"sync_module_states": 0}, "sync_module_states must be True or False"),
        ({"grad_reduce_dtype": torch.int32}, "grad_reduce_dtype must be None or one of"),
    ],
)
def test_bad_values_are_rejected_with_the_field_name(kwargs: dict, message: str) -> None:
    with pytest.raises((ValueError, TypeError), match=message):
        OverlapConfig(**kwargs)


def test_fields_are_keyword_only() -> None:
    with pytest.raises(TypeError):
        OverlapConfig(1000)  # type: ignore[misc]


def test_none_values_are_allowed_where_documented() -> None:
    config = OverlapConfig(bucket_elements=None, grad_reduce_dtype=None)
    assert config.bucket_elements is None and config.grad_reduce_dtype is None
