"""A mixture's validation record (`held_out.mixture_scores`) and how `MetricsLogger` writes it: metrics.jsonl
keeps every member's scores, TensorBoard gets `val/<member>/...` beside the overall `val/...`."""

from __future__ import annotations

import json

import pytest
from gr00t_train.metrics.records import MetricsLogger
from gr00t_train.validation.held_out import mixture_scores


def _member(mse: float, baseline: float, samples: int, group: str) -> dict:
    scores = {"mse": mse, "baseline": baseline, "ratio": mse / baseline}
    return {**scores, "samples": samples, "groups": {group: dict(scores)}}


class _Scalars:
    """Records what a TensorBoard SummaryWriter would be given."""

    def __init__(self) -> None:
        self.scalars: dict[str, float] = {}

    def add_scalar(self, tag: str, value: float, step: int) -> None:
        self.scalars[tag] = value

    def close(self) -> None:
        pass


def test_overall_scores_are_the_members_sample_weighted_means() -> None:
    record = mixture_scores({"arm": _member(0.2, 0.4, 8, "gripper"), "gr1": _member(0.5, 2.0, 24, "hand")})
    assert record["samples"] == 32 and record["groups"] == {}
    assert record["mse"] == pytest.approx((8 * 0.2 + 24 * 0.5) / 32)
    assert record["baseline"] == pytest.approx((8 * 0.4 + 24 * 2.0) / 32)
    assert record["ratio"] == pytest.approx(record["mse"] / record["baseline"])
    assert record["members"]["gr1"]["groups"]["hand"]["mse"] == 0.5


def test_the_logger_writes_every_members_scores(tmp_path) -> None:
    members = {"arm": _member(0.2, 0.4, 8, "gripper"), "gr1": _member(0.5, 2.0, 24, "hand")}
    record = {"kind": "val", "step": 2, "seconds": 0.1, **mixture_scores(members)}
    logger = MetricsLogger(
        tmp_path, total_steps=4, start_step=0, enabled=True, progress=False, tensorboard=False
    )
    logger._tb = _Scalars()
    logger.log_validation(record)
    scalars = logger._tb.scalars
    logger.close()
    assert json.loads((tmp_path / "metrics.jsonl").read_text())["members"] == members
    assert scalars["val/mse"] == record["mse"] and scalars["val/arm/mse"] == 0.2
    assert scalars["val/gr1/baseline"] == 2.0 and scalars["val/gr1/hand/ratio"] == 0.25
