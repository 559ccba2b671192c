"""Statistics of a used feature must be finite numbers, whichever of them the normalization mode reads."""

from __future__ import annotations

import pytest
from gr00t_model import EmbodimentSpec

MODALITY = {"state": {"arm": {"start": 0, "end": 3}}, "action": {"arm": {"start": 0, "end": 2}}}


def _stats():
    column = {"min": [0.0] * 3, "max": [1.0] * 3, "mean": [0.5] * 3, "std": [0.1] * 3}
    return {"observation.state": column, "action": {k: v[:2] for k, v in column.items()}}


@pytest.mark.parametrize("name", ["mean", "std", "min"])
def test_a_nan_statistic_is_an_error_under_min_max_too(name) -> None:
    stats = _stats()
    stats["observation.state"][name][1] = float("nan")
    with pytest.raises(
        ValueError, match=rf"'observation.state' '{name}' is nan at index 1 \(joint group 'arm'\)"
    ):
        EmbodimentSpec.from_modality(MODALITY, stats, "new_embodiment", action_horizon=4)


def test_a_string_statistic_names_the_feature_and_statistic() -> None:
    stats = _stats()
    stats["action"]["max"] = "big"
    with pytest.raises(ValueError, match=r"stats.json 'action' 'max' is not a list of numbers") as err:
        EmbodimentSpec.from_modality(MODALITY, stats, "new_embodiment", action_horizon=4, source="meta")
    assert "joint group 'arm'" in str(err.value)
