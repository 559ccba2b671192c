"""The validation component: open-loop action MSE on the held-out samples (`TrainParts.validation`) every
`eval.every` steps and after the last step, next to predicting the mean action (`validation/held_out.py` scores).

A validation leaves the training run as it found it: the same losses bit for bit with and without it. It
reads its own preloaded samples (the training pipeline's order is untouched), draws its noise from its own
seeded generators with every random stream of the process saved and restored around it, runs without
gradients, outside any CUDA graph and with compiled blocks eager (`EVAL_STANCE`), and puts every module back
in the training mode it had. Ranks split the batches (rank r scores batches r, r + world size, ...) and
all-reduce the sums: every rank calls `run` at the same steps."""

from __future__ import annotations

import logging
import time
from typing import Any

import torch

from .._distributed import DistEnv
from .._parts import TrainParts
from ..config.sections import TrainConfig
from .held_out import ActionErrors, isolated_rng, score_line

log = logging.getLogger(__name__)

SAMPLES_PER_CALL = 64
"""Held-out samples per predict call (at least one batch): the batches are scored together, in calls of up
to this many samples, not at the training batch size (measured on the H200 with n1.6-3b: 4 calls of 16 took
410 ms, one call of 64 224 ms; the scores are per sample, so only rounding changes)."""
EVAL_STANCE = "force_eager"
"""How torch.compile'd blocks run during validation (`torch.compiler.set_stance`, torch >= 2.6; the H200 runs
2.11): "force_eager" runs their plain eager forward; "default" runs them compiled, recompiling them for
inference's shapes and no-grad mode at the first validation. Measured on the H200 (libero preset, n1.6-3b,
4 batches of 16 scored 16 at a time): force_eager 0.83-1.1 s per validation; default 18 s at the first, then
0.9 s, so no faster. The one switch to flip, after measuring again, if that changes."""


class ValidationComponent:
    """Scores the model on the held-out samples when due."""

    def __init__(self, cfg: TrainConfig, env: DistEnv, parts: TrainParts, model) -> None:
        """`model` is the Trainer's ModelComponent (the wrapped module, the optimizer's side stream)."""
        self.cfg, self.env, self.parts, self.model = cfg, env, parts, model
        self.held_out = parts.validation if cfg.eval.every > 0 else None
        self._cached: tuple[dict[str, torch.Tensor], torch.Tensor] | None = None
        self._per_call = SAMPLES_PER_CALL

    @property
    def on(self) -> bool:
        """Held-out samples exist and eval.every > 0."""
        return self.held_out is not None

    def due(self, step: int) -> bool:
        """Validate after optimizer step `step`: every eval.every steps and after the last."""
        return self.on and (step % self.cfg.eval.every == 0 or step == self.cfg.steps)

    def run(self, step: int) -> dict[str, Any]:
        """Score the current weights (every rank together); returns the record (metrics.jsonl's line, with
        the wall seconds it took, device synchronized), the same on every rank."""
        self.model.wait_for_update()  # optimizer_overlap: the update writes the weights on its side stream
        self._synchronize()
        started = time.perf_counter()
        wrapper = self.model.module
        modes = [(module, module.training) for module in wrapper.modules()]
        wrapper.eval()  # vla_overlap's finishes pending parameter gathers here: a collective, on every rank
        try:
            errors = self._score()
        finally:
            wrapper.train()
            for module, training in modes:  # exactly as before (a frozen DiT stays in eval mode)
                module.training = training
        errors.all_reduce()
        self._synchronize()
        seconds = time.perf_counter() - started
        record = {"kind": "val", "step": step, "seconds": seconds, **errors.scores()}
        if self.env.is_main:
            log.info(
                "validation at step %d: %s over %d held-out samples (%.2f s)",
                step, score_line(record), record["samples"], seconds,
            )  # fmt: skip
        return record

    def _score(self) -> ActionErrors:
        held, device = self.held_out, self.env.device
        inputs, noise = self._inputs()
        errors = ActionErrors(held.columns, device)
        baseline = held.baseline.to(device)
        with isolated_rng(device), torch.compiler.set_stance(EVAL_STANCE), torch.no_grad():
            for start in range(0, len(noise), self._per_call):
                part = slice(start, start + self._per_call)
                batch = {k: v[part].to(device, non_blocking=True) for k, v in inputs.items()}
                predicted = held.predict(self.parts.model, batch, noise[part].to(device, non_blocking=True))
                errors.add(predicted, batch["action"], baseline, batch["action_mask"])
        return errors

    def _inputs(self) -> tuple[dict[str, torch.Tensor], torch.Tensor]:
        """This rank's held-out batches and their noise, concatenated once (pinned for the copy on CUDA):
        eager inference at a training batch size is launch-bound, so larger calls cost less in all."""
        if self._cached is None:
            held = self.held_out
            keys = (
                [k for k, v in held.batches[0].items() if isinstance(v, torch.Tensor)] if held.batches else []
            )
            inputs = {k: torch.cat([b[k] for b in held.batches]) for k in keys}
            noises = [
                held.noise(i, len(b["action"]), torch.device("cpu")) for i, b in zip(held.ids, held.batches)
            ]
            noise = torch.cat(noises) if noises else torch.zeros(0)
            if self.env.device.type == "cuda":
                inputs, noise = {k: v.pin_memory() for k, v in inputs.items()}, noise.pin_memory()
            self._cached = inputs, noise
            self._per_call = max(SAMPLES_PER_CALL, max((len(b["action"]) for b in held.batches), default=1))
        return self._cached

    def _synchronize(self) -> None:
        if self.env.device.type == "cuda":
            torch.cuda.synchronize(self.env.device)
