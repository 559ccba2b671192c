"""Open-loop evaluation of a checkpoint: predicted action chunks against the recorded ones, per joint group."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path

import gr00t_model
import torch

from . import _data
from ._build import DATASET_META
from ._checkpoint import TRAIN_CONFIG, Checkpointer
from ._config import TrainConfig
from ._config_io import config_from_dict, read_config_file
from ._distributed import resolve_device
from ._errors import DataError


@dataclass
class EvalReport:
    """Mean squared error of predicted vs recorded actions, in dataset units, per action group."""

    checkpoint: str
    dataset: str
    samples: int
    steps_compared: int
    mse: dict[str, float] = field(default_factory=dict)
    """Per action group, over every real (not padded) step of every sample."""
    mse_all: float = 0.0

    def table(self) -> str:
        """A small text table for the terminal."""
        width = max(len(k) for k in [*self.mse, "all"])
        rows = [f"{'group'.ljust(width)}  MSE (dataset units)"]
        rows += [f"{name.ljust(width)}  {value:.6g}" for name, value in self.mse.items()]
        rows.append(f"{'all'.ljust(width)}  {self.mse_all:.6g}")
        return "\n".join(rows)

    def as_dict(self) -> dict:
        """JSON-ready fields."""
        return dataclasses.asdict(self)


def find_checkpoint(path: str | Path) -> Path:
    """A checkpoint folder, or the newest checkpoint inside a checkpoints folder."""
    path = Path(path)
    if (path / TRAIN_CONFIG).is_file():
        return path
    latest = Checkpointer(path, keep_last=1).latest()
    if latest is None:
        raise DataError(f"--checkpoint: {path} is neither a checkpoint nor a folder of checkpoints")
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
    model = gr00t_model.from_pretrained(folder, device=dev).eval()
    tokenizer = gr00t_model.load_tokenizer(cfg.model.tokenizer)
    data = _data.open_dataset(
        cfg, model_horizon=model.config.action_horizon, progress=False, meta_dir=folder / DATASET_META
    )
    processor = _data.make_processor(
        data, model.config, tokenizer, augment_on_device=False, vlm_seq_len=cfg.model.vlm_seq_len
    )
    to_model = _data.host_transform(data, processor)

    def transform(raw: dict) -> dict:
        out = to_model(raw)
        out["raw_state"], out["raw_action"] = raw["observation.state"], raw["action"]
        out["action_is_pad"] = raw["action_is_pad"]
        return out

    pipeline = vla_io.Pipeline(
        data.dataset, batch_size, transform=transform, seed=seed, device=str(dev), synchronous=True
    )
    torch.manual_seed(seed)
    groups = data.spec.action
    sums = {g.name: 0.0 for g in groups}
    counts = {g.name: 0 for g in groups}
    samples = steps = 0
    try:
        for index, batch in enumerate(pipeline):
            if index == batches:
                break
            predicted = processor.decode_action(model.get_action(batch), batch["raw_state"].cpu())
            recorded = batch["raw_action"].cpu().float()
            real = ~batch["action_is_pad"].cpu().bool()  # [B, T]
            offset = 0
            for g in groups:
                pred = predicted[..., offset : offset + (g.end - g.start)]
                err = (pred - recorded[..., g.start : g.end]) ** 2
                sums[g.name] += float(err[real].sum())
                counts[g.name] += int(real.sum()) * (g.end - g.start)
                offset += g.end - g.start
            samples += real.shape[0]
            steps += int(real.sum())
    finally:
        pipeline.close()
    if samples == 0:
        raise DataError(f"{dataset}: not a single batch of {batch_size} samples to evaluate")
    mse = {name: sums[name] / max(1, counts[name]) for name in sums}
    total = sum(sums.values()) / max(1, sum(counts.values()))
    return EvalReport(str(folder), str(dataset), samples, steps, mse, total)
