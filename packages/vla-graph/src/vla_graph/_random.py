"""Random numbers drawn eagerly, outside any graph, so graphed and eager runs consume the same stream.

A step's random inputs (diffusion times, noise) are drawn before each iteration and copied into static
buffers like any other input. `RandomDraws` builds such a draw function from declarative specs; any
callable `batch -> dict of tensors` works as well (for example one using torch.distributions)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import torch

DISTRIBUTIONS = ("normal", "uniform")


@dataclass(frozen=True, kw_only=True)
class RandomSpec:
    """One random tensor to draw per microbatch."""

    shape: tuple[int, ...]
    """Fixed shape of the tensor (batches have fixed shapes under graphs)."""
    distribution: str = "normal"
    """"normal" (mean, std) or "uniform" (low, high)."""
    mean: float = 0.0
    std: float = 1.0
    low: float = 0.0
    high: float = 1.0
    dtype: torch.dtype = torch.float32
    """A floating dtype."""

    def __post_init__(self) -> None:
        if not isinstance(self.shape, tuple) or not all(isinstance(n, int) and n >= 0 for n in self.shape):
            raise ValueError(f"RandomSpec.shape={self.shape!r} must be a tuple of non-negative ints")
        if self.distribution not in DISTRIBUTIONS:
            raise ValueError(
                f"RandomSpec.distribution={self.distribution!r} is not allowed; choose one of "
                + ", ".join(DISTRIBUTIONS)
            )
        if not self.std > 0:
            raise ValueError(f"RandomSpec.std={self.std!r} must be > 0")
        if not self.low < self.high:
            raise ValueError(f"RandomSpec.low={self.low!r} must be < RandomSpec.high={self.high!r}")
        if not self.dtype.is_floating_point:
            raise ValueError(f"RandomSpec.dtype={self.dtype} must be a floating dtype")


class RandomDraws:
    """A draw function built from specs: each call draws every spec, in order, from one generator.

    Pass it as `GraphedStep(draw=...)`; the drawn tensors join each microbatch under their spec names."""

    def __init__(
        self,
        specs: Mapping[str, RandomSpec],
        *,
        device: torch.device | str | None = None,
        generator: torch.Generator | None = None,
    ) -> None:
        if not specs:
            raise ValueError("RandomDraws needs at least one spec")
        for name, spec in specs.items():
            if not isinstance(spec, RandomSpec):
                raise TypeError(f"RandomDraws spec {name!r} is a {type(spec).__name__}, not a RandomSpec")
        self.specs = dict(specs)
        self.generator = generator
        if device is None:
            device = generator.device if generator is not None else "cpu"
        self.device = torch.device(device)
        if generator is not None and generator.device.type != self.device.type:
            raise ValueError(f"RandomDraws generator is on {generator.device} but device is {self.device}")

    def __call__(self, batch: Any = None) -> dict[str, torch.Tensor]:
        """Draw one value of every spec (the batch is unused: shapes are fixed by the specs)."""
        out = {}
        for name, spec in self.specs.items():
            value = torch.empty(spec.shape, dtype=spec.dtype, device=self.device)
            if spec.distribution == "normal":
                value.normal_(spec.mean, spec.std, generator=self.generator)
            else:
                value.uniform_(spec.low, spec.high, generator=self.generator)
            out[name] = value
        return out


def unique_generators(generators: Iterable[torch.Generator | None]) -> list[torch.Generator]:
    """Generators without duplicates (by identity) and without None."""
    seen: list[torch.Generator] = []
    for gen in generators:
        if gen is not None and not any(gen is other for other in seen):
            seen.append(gen)
    return seen


def snapshot_rng(generators: Iterable[torch.Generator]) -> list[tuple[torch.Generator, torch.Tensor]]:
    """The state of each generator, to undo the random numbers that warmup consumes."""
    return [(gen, gen.get_state()) for gen in unique_generators(generators)]


def restore_rng(snapshot: list[tuple[torch.Generator, torch.Tensor]]) -> None:
    """Put every generator back to its snapshotted state."""
    for gen, state in snapshot:
        gen.set_state(state)
