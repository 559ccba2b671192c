"""The validation component: open-loop action MSE on the held-out samples (`TrainParts.validation`) every
`eval.every` steps and after the last step, next to predicting the mean action (`validation/held_out.py` scores).

A validation leaves the training run as it found it: the same losses bit for bit with and without it. It
reads its own preloaded samples (the training pipeline's order is untouched), draws its noise from its own
seeded generators with every random stream of the process saved and restored around it, runs without
gradients, outside any CUDA graph and with compiled blocks eager (`EVAL_STANCE`), and puts every module back
in the training mode it had. Ranks split the batches (rank r scores batches r, r + world size, ...) and
all-reduce the sums: every rank calls `run` at the same steps.

A `data.mixture` run (`TrainParts.validation` a list, one HeldOut per member with held-out episodes) scores
each member's own eval.batches batches against its own baseline; the record adds `members` (each member's
scores) and its overall MSE and baseline are their sample-weighted means (`held_out.mixture_scores`)."""

from __future__ import annotations

import logging
import time
from typing import Any

import torch

from .._distributed import DistEnv
from .._parts import TrainParts
from ..config.sections import TrainConfig
from .held_out import ActionErrors, HeldOut, isolated_rng, mixture_scores, score_line

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
        held = parts.validation if cfg.eval.every > 0 else None
        self.mixture = isinstance(held, list)
        self.held_out: list[HeldOut] = held if self.mixture else [held] if held is not None else []
        """One HeldOut per scored dataset (a mixture's members with held-out episodes)."""
        self._cached: dict[int, tuple[dict[str, torch.Tensor], torch.Tensor, int]] = {}

    @property
    def on(self) -> bool:
        """Held-out samples exist and eval.every > 0."""
        return bool(self.held_out)

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
            errors = [self._score(i, held) for i, held in enumerate(self.held_out)]
        finally:
            wrapper.train()
            for module, training in modes:  # exactly as before (a frozen DiT stays in eval mode)
                module.training = training
        for member in errors:
            member.all_reduce()
        self._synchronize()
        seconds = time.perf_counter() - started
        if self.mixture:
            scores = mixture_scores({h.name: e.scores() for h, e in zip(self.held_out, errors)})
        else:
            scores = errors[0].scores()
        record = {"kind": "val", "step": step, "seconds": seconds, **scores}
        if self.env.is_main:
            log.info(
                "validation at step %d: %s over %d held-out samples (%.2f s)",
                step, score_line(record), record["samples"], seconds,
            )  # fmt: skip
            for name, member in record.get("members", {}).items():
                log.info("  %s: %s over %d samples", name, score_line(member), member["samples"])
        return record

    def _score(self, index: int, held: HeldOut) -> ActionErrors:
        device = self.env.device
        inputs, noise, per_call = self._inputs(index, held)
        errors = ActionErrors(held.columns, device)
        baseline = held.baseline.to(device)
        with isolated_rng(device), torch.compiler.set_stance(EVAL_STANCE), torch.no_grad():
            for start in range(0, len(noise), per_call):
                part = slice(start, start + per_call)
                batch = {k: v[part].to(device, non_blocking=True) for k, v in inputs.items()}
                predicted = held.predict(self.parts.model, batch, noise[part].to(device, non_blocking=True))
                errors.add(predicted, batch["action"], baseline, batch["action_mask"])
        return errors

    def _inputs(self, index: int, held: HeldOut) -> tuple[dict[str, torch.Tensor], torch.Tensor, int]:
        """This rank's held-out batches of one dataset and their noise, concatenated once (pinned for the copy
        on CUDA), and the samples per predict call: eager inference at a training batch size is launch-bound,
        so larger calls cost less in all."""
        if index not in self._cached:
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
            per_call = max(SAMPLES_PER_CALL, max((len(b["action"]) for b in held.batches), default=1))
            self._cached[index] = inputs, noise, per_call
        return self._cached[index]

    def _synchronize(self) -> None:
        if self.env.device.type == "cuda":
            torch.cuda.synchronize(self.env.device)
