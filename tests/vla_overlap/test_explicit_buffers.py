"""Gradient buffers written with no hook firing (what a replayed CUDA graph leaves behind) survive the eager
sync: buffers are not zeroed at a step's start, and only parameters missed by a step whose gradients came
through Python are cleared."""

from __future__ import annotations


def test_buffers_written_without_hooks_are_reduced_not_cleared(pool) -> None:
    assert all(result["ok"] for result in pool.run("replayed_buffers", 2))
