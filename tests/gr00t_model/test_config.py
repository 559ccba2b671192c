"""Config validation, presets, parameter counts of the release (reference section 4/11), FLOPs, the CLI."""

from __future__ import annotations

import json

import pytest
from gr00t_model import GR00TConfig, count_parameters, training_flops_per_sample
from gr00t_model.__main__ import main

# Reference section 11 (release code on the meta device) / section 4.
RELEASE_COUNTS = {
    "vision": 412_442_352,
    "connector": 13_644_800,
    "llm": 310_640_640 + 16 * 50_336_000 + 2_048,
    "dit": 1_091_722_240,
    "state_encoder": 54_607_872,
    "action_encoder": 232_931_328,
    "action_decoder": 37_785_600,
    "other": 4_096 + 1_572_864,
    "trainable": 1_619_968_000,
}


def test_n16_3b_parameter_counts_match_the_release() -> None:
    counts = count_parameters(GR00TConfig.preset("n1.6-3b"))
    for name, expected in RELEASE_COUNTS.items():
        assert abs(counts[name] - expected) <= 0.005 * expected, (name, counts[name], expected)
    # The release's 2,975,968,192 includes the never-called 15,238,352-parameter vision pooling head.
    assert counts["total"] == 2_975_968_192 - 15_238_352
    assert counts["total"] == sum(counts[c] for c in RELEASE_COUNTS if c != "trainable")


def test_code_defaults_preset_changes_only_horizon_and_dims() -> None:
    code, release = GR00TConfig.preset("n1.6-code-defaults"), GR00TConfig.preset("n1.6-3b")
    assert (code.action_horizon, code.max_state_dim, code.max_action_dim) == (16, 29, 29)
    assert code.replace(action_horizon=50, max_state_dim=128, max_action_dim=128, name="n1.6-3b") == release
    # reference table: action head 1.4073 B with max dims 29 (vs 1.4186 B)
    head = sum(
        v
        for k, v in count_parameters(code).items()
        if k in ("dit", "state_encoder", "action_encoder", "action_decoder", "other")
    )
    assert abs(head - 1.4073e9) / 1.4073e9 < 0.005


def test_tiny_preset_is_small_and_has_the_same_structure() -> None:
    counts = count_parameters(GR00TConfig.preset("tiny"))
    assert 1e6 < counts["total"] < 5e6
    assert all(counts[c] > 0 for c in RELEASE_COUNTS)


@pytest.mark.parametrize(
    ("num_images", "size", "tokens", "horizon", "train_tf"),
    [  # reference section 4; its train column also counts the lm_head forward we never run
        (1, (252, 252), 116, 50, 0.97),
        (1, (252, 252), 116, 16, 0.79),
        (2, (252, 336), 258, 50, 1.97),
        (2, (252, 252), 204, 50, 1.57),
        (3, (252, 252), 292, 50, 2.18),
    ],
)
def test_training_flops_match_the_reference_table(num_images, size, tokens, horizon, train_tf) -> None:
    config = GR00TConfig.preset("n1.6-3b", action_horizon=horizon)
    flops = training_flops_per_sample(config, num_images=num_images, image_size=size, vlm_tokens=tokens)
    assert abs((flops["train"] + flops["lm_head_avoided"]) / 1e12 - train_tf) < 0.006
    assert flops["train"] == pytest.approx(flops["fwd_total"] + flops["bwd_total"])


def test_flops_grow_when_more_is_trainable() -> None:
    base = GR00TConfig.preset("n1.6-3b")
    frozen = training_flops_per_sample(base.replace(tune_top_llm_layers=0))
    default = training_flops_per_sample(base)
    everything = training_flops_per_sample(base.replace(tune_llm=True, tune_visual=True))
    assert frozen["train"] < default["train"] < everything["train"]
    assert everything["train"] == pytest.approx(3 * everything["fwd_total"])
    assert training_flops_per_sample(base)["vlm_tokens"] == 116  # 28 + 7 + 81 for one 252x252 image


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        ("vision_num_positions", 250, "perfect square"),
        ("image_size", (250, 252), "multiples of 28"),
        ("tune_top_llm_layers", 17, "tune_top_llm_layers"),
        ("frozen_dtype", "int8", "frozen_dtype"),
        ("dit_num_heads", 31, "input_embedding_dim"),
        ("dit_dropout", 1.5, "dit_dropout"),
        ("llm_num_layers", 0, "llm_num_layers"),
        ("compute_dtype", None, "must match when compute_dtype is None"),
    ],
)
def test_invalid_config_names_the_field(field, value, message) -> None:
    with pytest.raises(ValueError, match=message):
        GR00TConfig.preset("n1.6-3b", **{field: value})


def test_config_dict_round_trip_and_unknown_preset() -> None:
    config = GR00TConfig.preset("tiny", action_horizon=8)
    assert GR00TConfig.from_dict(json.loads(json.dumps(config.to_dict()))) == config
    with pytest.raises(ValueError, match="unknown preset"):
        GR00TConfig.preset("n2")
    with pytest.raises(ValueError, match="unknown fields"):
        GR00TConfig.from_dict({"bogus": 1})


def test_summary_cli_json(capsys) -> None:
    assert main(["summary", "--preset", "n1.6-3b", "--cameras", "2", "--image-size", "256", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["image_size"] == [252, 252]
    assert report["parameters"]["dit"] == RELEASE_COUNTS["dit"]
    assert report["flops"]["vlm_tokens"] == 204
    assert main(["summary", "--preset", "tiny", "--set", "action_horizon=8"]) == 0
    assert "trainable" in capsys.readouterr().out
