"""OverlapConfig: every knob of the data-parallel wrapper, validated on construction."""

from __future__ import annotations

from dataclasses import dataclass

import torch

_FLOAT_DTYPES = (torch.float32, torch.bfloat16, torch.float16, torch.float64)


def _check_bool(name: str, value: object) -> None:
    if not isinstance(value, bool):
        raise TypeError(f"OverlapConfig.{name} must be True or False, got {value!r}")


@dataclass(kw_only=True)
class OverlapConfig:
    """How gradients and parameters travel between data-parallel ranks.

    The defaults overlap everything: bucket reductions start during backward and, with
    `DistributedAdamW`, parameter all-gathers are prefetched by forward pre-hooks.
    """

    bucket_elements: int | None = 40_000_000
    """Bucket size in elements, not bytes (a bucket closes once it holds at least this many; 40 M fp32
    gradients are 160 MB); None = one bucket per dtype buffer. Smaller buckets start communicating earlier
    in backward but launch more collectives."""

    overlap_grad_reduce: bool = True
    """Launch each bucket's reduction from the gradient hooks as soon as the bucket is complete (on the
    last microbatch). False is the baseline: every bucket is reduced after backward."""

    overlap_param_gather: bool = True
    """With `DistributedAdamW` only: all-gather updated parameters lazily, each bucket waited for by the
    forward pre-hook of the first module that uses it, which also starts the next bucket's gather.
    False gathers all buckets at the end of `step()`."""

    grad_reduce_dtype: torch.dtype | None = torch.float32
    """dtype of the gradient buffers (accumulation and reduction). None = each parameter's own dtype."""

    reduce_dtype: torch.dtype | None = None
    """dtype the gradients travel in (e.g. torch.bfloat16: half the bytes on the wire); accumulation stays in
    `grad_reduce_dtype`. Each bucket is rounded once after the 1/world pre-scale, reduced, then copied back.
    None = the gradient buffers' own dtype."""

    overwrite_first_grad: bool = True
    """Each step's first gradient of a parameter is copied into its buffer and later ones added, so the
    buffers need no zeroing pass (and a bf16 gradient lands in an fp32 buffer by a fast cast instead of a
    mixed-dtype add). Parameters that got no gradient are zeroed before the reduction. False zeroes every
    buffer at the start of a step (for code that adds into `param.main_grad` itself)."""

    allow_unused_params: bool = False
    """False: a trainable parameter that gets no gradient during a step (while others do) raises an
    error naming it, because it usually means it should have been frozen. True: a parameter unused on some
    ranks contributes a zero gradient there (buckets are always reduced in the same order on every rank); one
    that no rank used keeps ``.grad`` None and is not stepped by DistributedAdamW, as under torch DDP. Ranks
    agree on that with one small all-reduce (a flag per parameter, read back on the host) each step."""

    sync_module_states: bool = True
    """Broadcast parameters and buffers from the group's first rank when the wrapper is built."""

    def __post_init__(self) -> None:
        if self.bucket_elements is not None and (
            isinstance(self.bucket_elements, bool)
            or not isinstance(self.bucket_elements, int)
            or self.bucket_elements < 1
        ):
            raise ValueError(
                "OverlapConfig.bucket_elements must be a positive int (elements) or None, "
                f"got {self.bucket_elements!r}"
            )
        for name in (
            "overlap_grad_reduce",
            "overlap_param_gather",
            "overwrite_first_grad",
            "allow_unused_params",
            "sync_module_states",
        ):
            _check_bool(name, getattr(self, name))
        if self.reduce_dtype is not None and self.reduce_dtype not in _FLOAT_DTYPES:
            allowed = ", ".join(str(d) for d in _FLOAT_DTYPES)
            raise ValueError(
                f"OverlapConfig.reduce_dtype must be None or one of {allowed}; got {self.reduce_dtype!r}"
            )
        if self.grad_reduce_dtype is not None and self.grad_reduce_dtype not in _FLOAT_DTYPES:
            allowed = ", ".join(str(d) for d in _FLOAT_DTYPES)
            raise ValueError(
                f"OverlapConfig.grad_reduce_dtype must be None or one of {allowed}; got {self.grad_reduce_dtype!r}"
            )
