"""Helpers for the hooks the wrapper registers with torch (on parameters, modules and the autograd engine)."""

from __future__ import annotations

import weakref
from typing import Any

import torch


def current_autograd_node() -> Any:
    """The autograd node being executed by this thread (None outside backward), where torch exposes it."""
    current = getattr(torch._C, "_current_autograd_node", None)
    return current() if current is not None else None


def weak_call(owner: Any, method: str) -> Any:
    """A hook calling `owner.<method>()` without keeping `owner` alive (see OverlapDataParallel._make_grad_hook)."""
    ref = weakref.ref(owner)

    def hook(*_: Any) -> None:
        target = ref()
        if target is not None:
            getattr(target, method)()

    return hook
