"""`gr00t-train demo`: a small synthetic LIBERO-like dataset, the `tiny` model trained with the full async
pipeline, a checkpoint, and action inference from it, in a few minutes on a laptop CPU (or on a GPU)."""

from __future__ import annotations

import logging
import time
from pathlib import Path

from .config.io import apply_overrides
from .config.presets import demo_config

log = logging.getLogger(__name__)

DEMO_DATASET = {"episodes": 8, "episode_length": 60, "image_size": 64, "codec": "h264"}
"""Two 64x64 cameras, 8-d state, 7-d action, 20 fps, four tasks: small enough to train on 2 CPU cores."""


def ensure_dataset(path: Path) -> bool:
    """Write the demo dataset at `path` unless one is there; True when it was written."""
    if (path / "meta" / "info.json").is_file():
        return False
    import vla_io

    vla_io.write_synthetic_dataset(path, vla_io.testing.SynthConfig(**DEMO_DATASET))
    return True


def run_demo(out: Path, dataset: Path | None, overrides: list[str]) -> int:
    """Train, checkpoint and evaluate; prints what it does and where the files are."""
    from ._run import run_training
    from .validation.infer import evaluate

    start = time.perf_counter()
    data_dir = dataset or out / "dataset"
    if ensure_dataset(data_dir):
        print(f"[demo] wrote a synthetic LIBERO-like dataset to {data_dir} (2 cameras 64x64, 440 frames)")
    else:
        print(f"[demo] using the dataset at {data_dir}")
    # A demo starts over each time (the previous demo run is replaced), unless told otherwise. It holds one
    # episode out and validates on it three times (5% of 8 episodes would round down to none).
    base = [f"data.dataset={data_dir}", f"output_dir={out / 'run'}", "checkpoint.existing_run=overwrite"]
    base += ["data.val_episodes=1", f"eval.every={max(1, demo_config().steps // 3)}"]
    cfg = apply_overrides(demo_config(), [*base, *overrides])
    print(f"[demo] training the `tiny` GR00T N1.6 model for {cfg.steps} steps (device: {cfg.device})")
    summary = run_training(cfg)
    print(summary.table())
    print(f"[demo] open-loop action inference from the checkpoint on {data_dir}:")
    report = evaluate(cfg.checkpoint_dir, data_dir, batches=4, batch_size=cfg.data.batch_size)
    print(report.table())
    run = Path(cfg.output_dir)
    print(
        f"[demo] done in {time.perf_counter() - start:.0f} s. Files:\n"
        f"  checkpoint   {report.checkpoint}  (gr00t-train export CHECKPOINT OUT: a gr00t_model folder)\n"
        f"  loss curve   {run / 'loss.png'}\n"
        f"  step time    {run / 'step_time.png'}\n"
        f"  metrics      {run / 'metrics.jsonl'} (one line per step and per validation), {run / 'summary.json'}\n"
        f"  config       {run / 'config.json'} (gr00t-train train --config accepts it)"
    )
    return 0
