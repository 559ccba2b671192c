"""Start-up's model phase in parts (metrics.startup.MODEL_PARTS): a CPU run of the tiny model, plain and on a
data.mixture, names each part of the model phase in summary.json's `startup_model_parts` and one INFO line,
and the parts add up to the phase."""

from __future__ import annotations

import json
import logging

import pytest
from gr00t_train.cli import main
from gr00t_train.metrics.startup import MODEL_PARTS

CPU_PARTS = ("run_folder", "data_plan", "imports", "start_facts", "tokenizer", "weights", "frozen_prefix")


def _check_parts(summary: dict, cuda: bool = False) -> dict[str, float]:
    parts = summary["startup_model_parts"]
    assert set(CPU_PARTS) <= set(parts)
    assert ({"device", "device_sync"} <= set(parts)) == cuda  # the CUDA context and the build's kernels
    assert "adapters" not in parts  # LoRA only
    assert list(parts) == [name for name in (*MODEL_PARTS, "other") if name in parts]  # in the order they ran
    assert all(seconds >= 0 for seconds in parts.values())
    rounding = 0.0005 * (len(parts) + 1)  # each value and the phase are rounded to the millisecond
    assert abs(sum(parts.values()) - summary["startup_phases"]["model"]) <= rounding
    return parts


def test_a_run_names_the_parts_of_its_model_phase(dataset, tmp_path, train_args, caplog) -> None:
    out = tmp_path / "run"
    with caplog.at_level(logging.INFO, logger="gr00t_train.metrics.startup"):
        assert main(train_args(dataset, out, "steps=1", "checkpoint.save_final=false")) == 0
    parts = _check_parts(json.loads((out / "summary.json").read_text()))
    lines = [r.getMessage() for r in caplog.records if r.getMessage().startswith("start-up, model phase: ")]
    assert len(lines) == 1 and all(f"{name} " in lines[0] for name in parts)


@pytest.mark.gpu
def test_on_cuda_the_context_and_the_builds_kernels_are_parts_too(dataset, tmp_path, train_args) -> None:
    out = tmp_path / "run"
    assert main(train_args(dataset, out, "device=cuda", "steps=1", "checkpoint.save_final=false")) == 0
    _check_parts(json.loads((out / "summary.json").read_text()), cuda=True)


@pytest.fixture
def mixture_config(tmp_path):
    import vla_io

    synth = vla_io.testing.SynthConfig(episodes=2, episode_length=16, image_size=64, codec="h264")
    arm = vla_io.write_synthetic_dataset(tmp_path / "arm", synth, progress=False)
    arm2 = vla_io.write_synthetic_dataset(tmp_path / "arm2", synth.with_(seed=2), progress=False)
    path = tmp_path / "mixture.toml"
    path.write_text(f"""preset = "demo"
device = "cpu"
steps = 1
output_dir = "{tmp_path / "run"}"

[checkpoint]
save_final = false

[logging]
progress = false
plots = false

[data]
cameras = "none"
embodiment_tag = "new_embodiment"
batch_size = 4
num_workers = 1

[[data.mixture]]
dataset = "{arm}"
embodiment_tag = "libero_panda"

[[data.mixture]]
dataset = "{arm2}"
embodiment_tag = "libero_panda"
""")
    return path


def test_a_mixture_run_ends_its_model_phase_after_the_model(mixture_config, tmp_path) -> None:
    assert main(["train", "--config", str(mixture_config)]) == 0
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert {"model", "data"} <= set(summary["startup_phases"])  # the members open after the model is built
    _check_parts(summary)
