"""Which of a model's tensors a checkpoint writes, and where the others come from (`weights.json`).

A checkpoint does not repeat what it holds elsewhere or what the run started from:

- frozen tensors the base provided (the folder `model.checkpoint` names, recorded by path and by the SHA-256
  of its weight files, `checkpoint/base.py`) are read from the base again;
- trainable parameters whose fp32 master weight the optimizer state holds (vla_overlap's ZeRO-1 state) are
  that master, cast to the parameter's dtype: with `optimizations.bf16_weights` the bf16 working copy is the
  round-to-nearest-even of its master, exactly what the optimizer writes back (with `param_remainders`
  too: the master is decoded from weight and remainder, and the weight is its rounding);
- everything else is written (frozen tensors of a run from random weights, or that the base lacked;
  trainable parameters of an optimizer without masters, torch's AdamW).

`weights.json` lists the state-dict keys of each source; without it (older checkpoints) the model files hold
every tensor. `ModelView` gives the model's own saver and loader (`TrainParts.save_model` / `load_model`, which
call `state_dict`, `config` and `load_state_dict`) only the tensors written.
"""

from __future__ import annotations

import bisect
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import nn

WEIGHTS = "weights.json"
FORMAT = "gr00t_train.weights/1"


@dataclass(frozen=True)
class BaseWeights:
    """Where a model's frozen weights were loaded from: a folder, and the state-dict keys it provided."""

    path: Path
    keys: frozenset[str]


@dataclass
class WeightsPlan:
    """The state-dict keys of a model by source."""

    written: list[str]
    from_base: list[str] = field(default_factory=list)
    from_optimizer: list[str] = field(default_factory=list)
    """State-dict keys whose values lie inside the parameters `optimizer_params` (merged linears' parts too)."""
    optimizer_params: list[str] = field(default_factory=list)
    """Trainable parameters set from the optimizer state's fp32 masters."""

    def record(self, base: dict[str, Any] | None) -> dict[str, Any]:
        """The JSON of weights.json; `base` is the base's path and file digests (`checkpoint.base.describe`)."""
        return {
            "format": FORMAT,
            "base": base,
            "from_base": self.from_base,
            "from_optimizer": {"params": self.optimizer_params, "keys": self.from_optimizer},
        }


def plan_weights(
    model: nn.Module, base: BaseWeights | None, optimizer_state: dict[str, Any] | None
) -> WeightsPlan:
    """Which tensors of `model` a checkpoint writes: those neither in `base` (frozen ones it provided) nor
    derived from the fp32 masters in `optimizer_state` (trainable ones)."""
    saved = (optimizer_state or {}).get("state", {})
    params = dict(model.named_parameters())
    masters = [
        n
        for n, p in params.items()
        if p.requires_grad and isinstance(saved.get(n), dict) and "master" in saved[n]
    ]
    trainable = _spans([params[n] for n, p in params.items() if p.requires_grad])
    mastered = _spans([params[n] for n in masters])
    plan = WeightsPlan(written=[], optimizer_params=masters)
    for key, tensor in model.state_dict(keep_vars=True).items():
        if _inside(tensor, mastered):
            plan.from_optimizer.append(key)
        elif base is not None and key in base.keys and not _inside(tensor, trainable):
            plan.from_base.append(key)
        else:
            plan.written.append(key)
    return plan


def _spans(tensors: list[torch.Tensor]) -> list[tuple[int, int]]:
    """Sorted [start, end) byte ranges of tensors' memory."""
    return sorted((t.data_ptr(), t.data_ptr() + t.numel() * t.element_size()) for t in tensors if t.numel())


def _inside(tensor: torch.Tensor, spans: list[tuple[int, int]]) -> bool:
    """Whether `tensor`'s memory lies inside one of `spans` (a parameter itself, or a view of one)."""
    if not tensor.numel() or not spans:
        return False
    start = tensor.data_ptr()
    at = bisect.bisect_right(spans, (start, float("inf"))) - 1
    return at >= 0 and start + tensor.numel() * tensor.element_size() <= spans[at][1]


def read_record(folder: Path) -> dict[str, Any] | None:
    """A checkpoint's weights.json, or None when it has none (its model files hold every tensor)."""
    path = Path(folder) / WEIGHTS
    if not path.is_file():
        return None
    try:
        record = json.loads(path.read_text())
    except (OSError, ValueError) as err:
        raise ValueError(f"{path} is unreadable ({type(err).__name__}: {err})") from None
    if not isinstance(record, dict) or record.get("format") != FORMAT:
        raise ValueError(f"{path}: not a {FORMAT} record")
    return record


def elsewhere(record: dict[str, Any] | None) -> frozenset[str]:
    """The state-dict keys a checkpoint's model files leave out (read from its base or optimizer state)."""
    if record is None:
        return frozenset()
    return frozenset(record["from_base"]) | frozenset(record["from_optimizer"]["keys"])


class ModelView(nn.Module):
    """A model as its checkpoint's model files hold it, for the model's own saver and loader: `state_dict()`
    gives the tensors to write (live, or copies staged for a background write); `load_state_dict` loads into
    the model, which must then miss exactly the keys read from elsewhere. Other attributes (`config`) are the
    model's."""

    def __init__(
        self,
        model: nn.Module,
        tensors: dict[str, torch.Tensor] | None = None,
        elsewhere: frozenset[str] = frozenset(),
    ) -> None:
        super().__init__()
        object.__setattr__(self, "_model", model)  # not a submodule: its tensors stay out of this view's
        self._tensors = tensors or {}
        self._elsewhere = elsewhere

    def __getattr__(self, name: str) -> Any:  # the model's own attributes (config, lora_config) for its saver
        try:
            return super().__getattr__(name)
        except AttributeError:
            return getattr(object.__getattribute__(self, "_model"), name)

    def state_dict(self, *args: Any, **kwargs: Any) -> dict[str, torch.Tensor]:  # type: ignore[override]
        return dict(self._tensors)

    def load_state_dict(self, state_dict, strict: bool = True, assign: bool = False):  # type: ignore[override]
        result = self._model.load_state_dict(state_dict, strict=False, assign=assign)
        missing = set(result.missing_keys)
        wrong = sorted(missing - self._elsewhere) + sorted(self._elsewhere & set(state_dict))
        if strict and (wrong or result.unexpected_keys):
            raise RuntimeError(
                f"the model files do not match {WEIGHTS}: missing {sorted(missing - self._elsewhere)[:5]}, "
                f"unexpected {sorted(result.unexpected_keys)[:5]}, recorded as read from elsewhere but "
                f"present {sorted(self._elsewhere & set(state_dict))[:5]}"
            )
        return result
