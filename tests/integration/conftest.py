"""Fixtures of the end-to-end tests: one small synthetic LIBERO-like dataset per session, and a runner for
the `gr00t-train` command in this process."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch


@pytest.fixture(scope="session")
def dataset(tmp_path_factory) -> Path:
    """3 episodes x 24 frames, two 64x64 H.264 cameras, 8-d state, 7-d action (written once)."""
    import vla_io

    root = tmp_path_factory.mktemp("data") / "libero-like"
    config = vla_io.testing.SynthConfig(episodes=3, episode_length=24, image_size=64, codec="h264")
    vla_io.write_synthetic_dataset(root, config)
    return root


@pytest.fixture
def dataset_copy(dataset, tmp_path) -> Path:
    """A private copy of the dataset, for tests that break it."""
    copy = tmp_path / "broken"
    shutil.copytree(dataset, copy)
    return copy


@pytest.fixture
def nan_actions_copy(dataset_copy) -> Path:
    """A private copy of the dataset whose episode 1 has NaN in every action value."""
    path = next(dataset_copy.glob("data/**/episode_000001.parquet"))
    table = pq.read_table(path)
    actions = [[float("nan")] * len(row) for row in table.column("action").to_pylist()]
    column = table.schema.get_field_index("action")
    pq.write_table(
        table.set_column(column, "action", pa.array(actions, table.schema.field("action").type)), path
    )
    return dataset_copy


def _train_args(dataset: Path, out: Path, *sets: str) -> list[str]:
    """`gr00t-train train` on the demo preset, shrunk to a few fast steps."""
    base = [
        f"data.dataset={dataset}",
        f"output_dir={out}",
        "device=cpu",
        "steps=6",
        "data.batch_size=4",
        "data.num_workers=1",
        "logging.every=1",
        "logging.progress=false",
        "logging.plots=false",
    ]
    args = ["train", "--preset", "demo"]
    for item in [*base, *sets]:
        args += ["--set", item]
    return args


def _losses(run: Path) -> dict[int, float]:
    """step -> loss from a run's metrics.jsonl (the last line of a step wins, as after a resume; validation
    lines, `"kind": "val"`, left out)."""
    out = {}
    for line in (run / "metrics.jsonl").read_text().splitlines():
        row = json.loads(line)
        if "kind" not in row:
            out[row["step"]] = row["loss"]
    return out


@pytest.fixture(autouse=True)
def _one_thread():
    torch.set_num_threads(1)


@pytest.fixture(scope="session")
def train_args():
    """`train_args(dataset, out, "key=value", ...)` -> argv of a short `gr00t-train train` run."""
    return _train_args


@pytest.fixture(scope="session")
def losses():
    """`losses(run_dir)` -> {step: loss}."""
    return _losses
