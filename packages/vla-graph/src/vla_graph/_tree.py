"""Nested batches (dicts, lists and tuples of tensors and plain Python values) as flat, named leaves.

Graphs bake shapes, dtypes and Python values in at capture, so everything here is about naming each leaf
(`batch['tokens']`) and comparing a batch against the one a graph was captured with."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import torch

# Python values a graph may freeze at capture; anything else must be converted to a tensor first.
_PLAIN = (bool, int, float, str, bytes, torch.dtype, torch.device, type(None))

LeafSignature = tuple  # ("tensor", shape, dtype, device) or ("value", value)


def flatten(tree: Any, prefix: str = "batch") -> list[tuple[str, Any]]:
    """Every leaf of a nested dict/list/tuple with a readable path such as `batch['images'][0]`."""
    if isinstance(tree, Mapping):
        return [item for key, value in tree.items() for item in flatten(value, f"{prefix}[{key!r}]")]
    if isinstance(tree, (list, tuple)):
        return [item for index, value in enumerate(tree) for item in flatten(value, f"{prefix}[{index}]")]
    return [(prefix, tree)]


def map_tree(fn: Callable[[Any], Any], tree: Any) -> Any:
    """The same nesting with `fn` applied to every leaf (mappings come back as plain dicts)."""
    if isinstance(tree, Mapping):
        return {key: map_tree(fn, value) for key, value in tree.items()}
    if isinstance(tree, tuple) and hasattr(tree, "_fields"):  # namedtuple
        return type(tree)(*(map_tree(fn, value) for value in tree))
    if isinstance(tree, (list, tuple)):
        return type(tree)(map_tree(fn, value) for value in tree)
    return fn(tree)


def tensors(tree: Any) -> list[torch.Tensor]:
    """The tensor leaves of a tree, in `flatten` order."""
    return [leaf for _, leaf in flatten(tree) if isinstance(leaf, torch.Tensor)]


def leaf_signature(path: str, leaf: Any) -> LeafSignature:
    """What a graph bakes in about one leaf; raises for leaves a graph cannot take."""
    if isinstance(leaf, torch.Tensor):
        if leaf.requires_grad:
            raise TypeError(
                f"{path} requires grad; static graph inputs are plain tensors, so gradients would not reach "
                "it. Pass data (no requires_grad) and keep trainable tensors inside the model."
            )
        return ("tensor", tuple(leaf.shape), leaf.dtype, leaf.device)
    if isinstance(leaf, _PLAIN):
        return ("value", type(leaf).__name__, leaf)
    raise TypeError(
        f"{path} is a {type(leaf).__name__}; batches may hold tensors and plain Python values "
        "(bool, int, float, str, None) only. Convert it to a tensor."
    )


def signature(tree: Any, prefix: str = "batch") -> tuple[tuple[str, LeafSignature], ...]:
    """Hashable description of a batch: path, shape, dtype and device of each tensor, value of each other leaf."""
    return tuple((path, leaf_signature(path, leaf)) for path, leaf in flatten(tree, prefix))


def _describe(sig: LeafSignature) -> str:
    if sig[0] == "tensor":
        _, shape, dtype, device = sig
        return f"a tensor of shape {tuple(shape)}, {dtype}, on {device}"
    return f"the Python {sig[1]} {sig[2]!r}"


def describe_difference(expected: tuple, got: tuple) -> list[str]:
    """Human-readable lines saying how `got` differs from the captured `expected` signature."""
    want, have = dict(expected), dict(got)
    lines = [f"{path} is missing (the graph was captured with it)" for path in want if path not in have]
    lines += [f"{path} is new (the graph was captured without it)" for path in have if path not in want]
    for path, sig in have.items():
        if path in want and want[path] != sig:
            old = want[path]
            if sig[0] == old[0] == "tensor":
                parts = [
                    f"{name} {b} instead of {a}"
                    for name, a, b in zip(("shape", "dtype", "device"), old[1:], sig[1:])
                    if a != b
                ]
                lines.append(f"{path} has " + ", ".join(parts))
            else:
                lines.append(f"{path} is {_describe(sig)}, but the graph was captured with {_describe(old)}")
    return lines


@torch.no_grad()
def copy_into(destination: Any, source: Any) -> None:
    """Copy every tensor leaf of `source` into the same leaf of `destination` (same structure and shapes)."""
    for dst, src in zip(tensors(destination), tensors(source)):
        if dst.data_ptr() != src.data_ptr():
            dst.copy_(src, non_blocking=True)


def detach(tree: Any) -> Any:
    """Detach every tensor leaf (step outputs must not keep autograd graphs alive)."""
    return map_tree(lambda leaf: leaf.detach() if isinstance(leaf, torch.Tensor) else leaf, tree)


def clone(tree: Any) -> Any:
    """Copy every tensor leaf out of graph-owned memory."""
    return map_tree(lambda leaf: leaf.clone() if isinstance(leaf, torch.Tensor) else leaf, tree)
