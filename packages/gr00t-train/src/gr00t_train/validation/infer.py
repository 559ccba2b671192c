"""Open-loop evaluation of a checkpoint: predicted action chunks against the recorded ones, per joint group,
next to predicting the mean action (the scores are `validation/held_out.py`'s, as in training's validation)."""

from __future__ import annotations

import dataclasses
import logging
import math
from dataclasses import dataclass, field
from pathlib import Path

import gr00t_model
import torch

from .._distributed import resolve_device
from .._errors import DataError
from ..checkpoint.checkpointer import _STEP_DIR, TRAIN_CONFIG, Checkpointer, verify_checkpoint
from ..checkpoint.export import is_export
from ..checkpoint.manifest import check_manifest
from ..checkpoint.restore import BaseError, load_pretrained
from ..config.io import config_from_dict, read_config_file
from ..config.sections import TrainConfig
from ..data import dataset as _data
from ..data.mixture import member_of
from ..model.build import DATASET_META
from .held_out import ActionErrors, action_columns, mean_action

log = logging.getLogger(__name__)


@dataclass
class EvalReport:
    """Mean squared error of predicted vs recorded actions per action group, in dataset units and on the
    normalized scale, next to the baseline of predicting the training set's mean action (`validation/held_out.py`)."""

    checkpoint: str
    dataset: str
    samples: int
    steps_compared: int
    mse: dict[str, float] = field(default_factory=dict)
    """Per action group, in dataset units, over every real (not padded) step of every sample."""
    mse_all: float = 0.0
    mse_normalized: dict[str, float] = field(default_factory=dict)
    """Per action group, on the normalized scale the model predicts (min/max groups: [-1, 1] = range)."""
    mse_normalized_all: float = 0.0
    baseline: dict[str, float] = field(default_factory=dict)
    """Per action group, in dataset units: the MSE of predicting the mean action of the run's statistics."""
    baseline_all: float = 0.0
    baseline_normalized: dict[str, float] = field(default_factory=dict)
    """The same on the normalized scale (what training's validation reports)."""
    baseline_normalized_all: float = 0.0
    ratio: dict[str, float] = field(default_factory=dict)
    """mse_normalized / baseline_normalized per group: below 1 the model predicts better than the mean."""
    ratio_all: float = 0.0

    def table(self) -> str:
        """A small text table for the terminal."""
        width = max(len(k) for k in [*self.mse, "group"])
        heads = ("MSE (dataset units)", "MSE (normalized)", "mean baseline (normalized)", "ratio")
        rows = ["  ".join([f"{'group'.ljust(width)}", *(f"{h:>{len(h)}}" for h in heads)])]
        values = [
            (name, self.mse[name], self.mse_normalized[name], self.baseline_normalized.get(name, math.nan),
             self.ratio.get(name, math.nan))
            for name in self.mse
        ]  # fmt: skip
        values.append(
            ("all", self.mse_all, self.mse_normalized_all, self.baseline_normalized_all, self.ratio_all)
        )
        for name, *numbers in values:
            cells = [f"{v:>{len(h)}.{g}}" for v, h, g in zip(numbers, heads, ("6g", "4f", "4f", "3f"))]
            rows.append("  ".join([name.ljust(width), *cells]))
        rows.append("ratio = MSE / mean baseline (normalized): below 1 the model beats predicting the mean")
        return "\n".join(rows)

    def as_dict(self) -> dict:
        """JSON-ready fields."""
        return dataclasses.asdict(self)


def find_checkpoint(path: str | Path) -> Path:
    """A checkpoint folder (or an exported one), or the newest checkpoint inside a checkpoints folder."""
    path = Path(path)
    if (path / TRAIN_CONFIG).is_file() or _STEP_DIR.match(path.name):
        # a damaged folder stops here, naming the file, not in a loader (an export has no trainer state)
        reason = check_manifest(path) if is_export(path) else verify_checkpoint(path)
        if reason is not None:
            raise DataError(f"--checkpoint: {path} cannot be used: {reason}")
        return path
    checkpoints = Checkpointer(path, keep_last=1)
    if checkpoints.latest() is None:
        raise DataError(f"--checkpoint: {path} is neither a checkpoint nor a folder of checkpoints")
    latest, skipped = checkpoints.newest_intact()
    for line in skipped:
        log.warning("%s", line)
    if latest is None:
        raise DataError(f"--checkpoint: no intact checkpoint in {path}: " + "; ".join(skipped))
    return latest


def evaluate(
    checkpoint: str | Path,
    dataset: str | Path,
    *,
    batches: int = 4,
    batch_size: int = 8,
    device: str = "auto",
    seed: int = 0,
) -> EvalReport:
    """Predict action chunks for `batches` batches of `dataset` (a seeded random sample of frames) with
    the model of `checkpoint`, and compare with the recorded chunks."""
    import vla_io

    folder = find_checkpoint(checkpoint)
    cfg = config_from_dict(TrainConfig, read_config_file(folder / TRAIN_CONFIG))
    meta_dir = folder / DATASET_META
    if cfg.data.mixture:  # a mixture's checkpoint: the entry of `dataset`, with its own statistics
        cfg, member = member_of(cfg, dataset)
        meta_dir = meta_dir / member
    cfg.data.dataset = str(dataset)
    dev = resolve_device(device)
    try:  # a checkpoint's base and optimizer masters resolved (`checkpoint/restore.py`)
        model = load_pretrained(folder, device=dev)[0].eval()
    except BaseError as err:
        raise DataError(f"--checkpoint: {err}") from None
    except Exception as err:  # loaders rarely name the folder
        raise DataError(
            f"--checkpoint: cannot load the model of {folder}: {type(err).__name__}: {err}"
        ) from err
    tokenizer = gr00t_model.load_tokenizer(cfg.model.tokenizer)
    data = _data.open_dataset(
        cfg, model_horizon=model.config.action_horizon, progress=False, meta_dir=meta_dir
    )
    processor = _data.make_processor(
        data, model.config, tokenizer, vlm_seq_len=cfg.model.vlm_seq_len, image_mode="torch"
    )
    to_model = _data.host_transform(data, processor)

    def transform(raw: dict) -> dict:
        out = to_model(raw)
        out["raw_state"], out["raw_action"] = data.raw_state(raw), data.raw_action(raw)
        out["action_is_pad"] = data.action_is_pad(raw)
        return out

    pipeline = vla_io.Pipeline(
        data.dataset, batch_size, transform=transform, seed=seed, device=str(dev), synchronous=True
    )
    columns = action_columns(data.spec)
    normalized_mean = mean_action(data.spec, data.horizon)  # [T, D]
    raw, norm, steps = ActionErrors(columns), ActionErrors(columns), 0
    with torch.random.fork_rng(devices=[dev] if dev.type == "cuda" else []):  # the caller's streams stay
        torch.manual_seed(seed)
        try:
            for index, batch in enumerate(pipeline):
                if index == batches:
                    break
                normalized = model.get_action(batch).float().cpu()  # [B, model horizon, max_action_dim]
                state = batch["raw_state"].cpu()
                real = ~batch["action_is_pad"].cpu().bool()  # [B, T]
                # dataset units, groups in order (decode_action's layout): model, recorded, the mean
                predicted = processor.decode_action(normalized, state)
                recorded = torch.cat(
                    [batch["raw_action"][..., g.start : g.end].cpu() for g in data.spec.action], -1
                )
                mean = processor.decode_action(_padded(normalized_mean, normalized), state)
                raw.add(predicted, recorded, mean, real)
                norm.add(normalized, batch["action"].cpu(), normalized_mean, real)
                steps += int(real.sum())
        finally:
            pipeline.close()
    if norm.samples == 0:
        raise DataError(f"{dataset}: not a single batch of {batch_size} samples to evaluate")
    return _report(folder, dataset, raw.scores(), norm.scores(), steps)


def _padded(chunk: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    """[T, D] -> the model's output shape of `like` ([B, horizon, max_action_dim]), zeros around."""
    out = torch.zeros_like(like)
    out[:, : chunk.shape[0], : chunk.shape[1]] = chunk
    return out


def _report(folder: Path, dataset, raw: dict, norm: dict, steps: int) -> EvalReport:
    groups = list(norm["groups"])
    return EvalReport(
        str(folder),
        str(dataset),
        norm["samples"],
        steps,
        mse={g: raw["groups"][g]["mse"] for g in groups},
        mse_all=raw["mse"],
        mse_normalized={g: norm["groups"][g]["mse"] for g in groups},
        mse_normalized_all=norm["mse"],
        baseline={g: raw["groups"][g]["baseline"] for g in groups},
        baseline_all=raw["baseline"],
        baseline_normalized={g: norm["groups"][g]["baseline"] for g in groups},
        baseline_normalized_all=norm["baseline"],
        ratio={g: norm["groups"][g]["ratio"] for g in groups},
        ratio_all=norm["ratio"],
    )
