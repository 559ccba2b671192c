"""Open-loop evaluation of a checkpoint: predicted action chunks against the recorded ones, per joint group."""

from __future__ import annotations

import dataclasses
import logging
from dataclasses import dataclass, field
from pathlib import Path

import gr00t_model
import torch

from . import _data
from ._build import DATASET_META
from ._checkpoint import _STEP_DIR, TRAIN_CONFIG, Checkpointer, verify_checkpoint
from ._config import TrainConfig
from ._config_io import config_from_dict, read_config_file
from ._distributed import resolve_device
from ._errors import DataError

log = logging.getLogger(__name__)


@dataclass
class EvalReport:
    """Mean squared error of predicted vs recorded actions, in dataset units, per action group."""

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

    def table(self) -> str:
        """A small text table for the terminal."""
        width = max(len(k) for k in [*self.mse, "group"])
        rows = [f"{'group'.ljust(width)}  {'MSE (dataset units)':>20}  {'MSE (normalized)':>17}"]
        rows += [
            f"{name.ljust(width)}  {self.mse[name]:>20.6g}  {self.mse_normalized[name]:>17.4f}"
            for name in self.mse
        ]
        rows.append(f"{'all'.ljust(width)}  {self.mse_all:>20.6g}  {self.mse_normalized_all:>17.4f}")
        return "\n".join(rows)

    def as_dict(self) -> dict:
        """JSON-ready fields."""
        return dataclasses.asdict(self)


def find_checkpoint(path: str | Path) -> Path:
    """A checkpoint folder, or the newest checkpoint inside a checkpoints folder."""
    path = Path(path)
    if (path / TRAIN_CONFIG).is_file() or _STEP_DIR.match(path.name):
        reason = verify_checkpoint(path)  # a damaged folder stops here, naming the file, not in a loader
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
    cfg.data.dataset = str(dataset)
    dev = resolve_device(device)
    try:
        model = gr00t_model.from_pretrained(folder, device=dev).eval()
    except Exception as err:  # loaders rarely name the folder
        raise DataError(
            f"--checkpoint: cannot load the model of {folder}: {type(err).__name__}: {err}"
        ) from err
    tokenizer = gr00t_model.load_tokenizer(cfg.model.tokenizer)
    data = _data.open_dataset(
        cfg, model_horizon=model.config.action_horizon, progress=False, meta_dir=folder / DATASET_META
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
    torch.manual_seed(seed)
    groups = data.spec.action
    raw_err = {g.name: 0.0 for g in groups}
    norm_err = {g.name: 0.0 for g in groups}
    counts = {g.name: 0 for g in groups}
    samples = steps = 0
    try:
        for index, batch in enumerate(pipeline):
            if index == batches:
                break
            normalized = model.get_action(batch).float().cpu()  # [B, model horizon, max_action_dim]
            predicted = processor.decode_action(normalized, batch["raw_state"].cpu())  # [B, T, D]
            recorded = batch["raw_action"].cpu().float()
            target = batch["action"].cpu().float()
            real = ~batch["action_is_pad"].cpu().bool()  # [B, T]
            horizon, offset = real.shape[1], 0
            for g in groups:
                width = g.end - g.start
                cols = slice(offset, offset + width)
                raw_err[g.name] += float(
                    ((predicted[..., cols] - recorded[..., g.start : g.end]) ** 2)[real].sum()
                )
                diff = normalized[:, :horizon, cols] - target[:, :horizon, cols]
                norm_err[g.name] += float((diff**2)[real].sum())
                counts[g.name] += int(real.sum()) * width
                offset += width
            samples += real.shape[0]
            steps += int(real.sum())
    finally:
        pipeline.close()
    if samples == 0:
        raise DataError(f"{dataset}: not a single batch of {batch_size} samples to evaluate")
    total = max(1, sum(counts.values()))
    return EvalReport(
        str(folder),
        str(dataset),
        samples,
        steps,
        {name: raw_err[name] / max(1, counts[name]) for name in raw_err},
        sum(raw_err.values()) / total,
        {name: norm_err[name] / max(1, counts[name]) for name in norm_err},
        sum(norm_err.values()) / total,
    )
