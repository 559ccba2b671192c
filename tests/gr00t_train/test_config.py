"""Config: files, overrides, typed parsing, validation messages, presets, resolved JSON."""

from __future__ import annotations

import json
import os

import gr00t_train
import pytest
import torch
from gr00t_train import ConfigError, TrainConfig, apply_overrides, load_config
from gr00t_train.config.io import write_config_json


def test_defaults_and_presets_are_valid() -> None:
    assert TrainConfig().optimizations.graph == "auto"
    demo, libero = gr00t_train.demo_config(), gr00t_train.libero_config()
    assert libero.optimizations == gr00t_train.OptimizationsConfig()  # presets name only what differs
    assert demo.model.preset == "tiny" and demo.optimizations.data == "async"
    assert libero.model.preset == "n1.6-3b" and libero.data.batch_size == 16
    assert libero.data.cameras == ["image", "wrist_image"]
    assert set(gr00t_train.PRESETS) == {"demo", "libero"}


def test_toml_and_yaml_files_give_the_same_config(tmp_path) -> None:
    (tmp_path / "run.toml").write_text(
        'preset = "libero"\nsteps = 50\n[optim]\nlr = 3e-4\nbetas = [0.9, 0.95]\n'
        '[optimizations]\ncomm = "zero1_overlap"\ngraph = "full_iteration"\n[data]\ncameras = ["front"]\n'
    )
    (tmp_path / "run.yaml").write_text(
        "preset: libero\nsteps: 50\noptim: {lr: 3.0e-4, betas: [0.9, 0.95]}\n"
        "optimizations: {comm: zero1_overlap, graph: full_iteration}\ndata: {cameras: [front]}\n"
    )
    a, b = load_config(tmp_path / "run.toml"), load_config(tmp_path / "run.yaml")
    assert a == b
    assert a.optim.betas == (0.9, 0.95) and a.optim.lr == 3e-4 and a.steps == 50
    assert a.model.preset == "n1.6-3b"  # the rest comes from the preset
    assert a.optimizations.fused_optimizer is True


@pytest.mark.parametrize(
    ("override", "path", "expected"),
    [
        ("optim.lr=1e-3", ("optim", "lr"), 1e-3),
        ("steps=7", ("steps",), 7),
        ("optimizations.tf32=false", ("optimizations", "tf32"), False),
        ("optimizations.fused_optimizer=0", ("optimizations", "fused_optimizer"), False),
        ("data.cameras=front,wrist", ("data", "cameras"), ["front", "wrist"]),
        ("data.cameras=[front, wrist]", ("data", "cameras"), ["front", "wrist"]),
        ('data.cameras=["a"]', ("data", "cameras"), ["a"]),
        ("data.cameras=none", ("data", "cameras"), None),
        ("model.action_horizon=16", ("model", "action_horizon"), 16),
        ("optim.betas=0.8,0.9", ("optim", "betas"), (0.8, 0.9)),
        ("logging.peak_tflops=989", ("logging", "peak_tflops"), 989.0),
        ("checkpoint.resume=auto", ("checkpoint", "resume"), "auto"),
    ],
)
def test_overrides_are_parsed_by_field_type(override: str, path: tuple, expected) -> None:
    cfg = apply_overrides(TrainConfig(), [override])
    value = cfg
    for part in path:
        value = getattr(value, part)
    assert value == expected and type(value) is type(expected)


@pytest.mark.parametrize(
    ("override", "message"),
    [
        (
            "optimizations.comm=nccl",
            "optimizations.comm: 'nccl' is not one of the allowed values: "
            "auto, allreduce_after_backward, ddp, overlap, zero1_overlap",
        ),
        (
            "optimizations.graph=cuda",
            "optimizations.graph: 'cuda' is not one of the allowed values: "
            "auto, eager, full_iteration, per_microbatch",
        ),
        (
            "optimizations.data=threads",
            "optimizations.data: 'threads' is not one of the allowed values: dataloader, sync, async",
        ),
        ("optim.lr=0", "optim.lr: must be > 0"),
        ("optim.lr=fast", "optim.lr: expected a number, got 'fast'"),
        ("data.batch_size=0", "data.batch_size: must be >= 1"),
        ("data.batch_size=2.5", "data.batch_size: expected an integer"),
        ("optimizations.tf32=maybe", "optimizations.tf32: expected true or false"),
        ("optim.warmup_ratio=1.5", "optim.warmup_ratio: must be in [0, 1)"),
        ("data.cameras=a,a", "data.cameras: lists a key twice"),
        ("optim.learning_rate=1", "optim.learning_rate: unknown setting; allowed here: betas,"),
        ("precision=fp16", "precision: 'fp16' is not one of the allowed values: auto, bf16, fp32"),
        ("optim=1", "optim: expected a table of settings"),
        ("lr", "must look like section.field=value"),
        ("logging.profile_steps=-1", "logging.profile_steps: must be >= 0"),
        (
            "optimizations.triton_attention=maybe",
            "optimizations.triton_attention: 'maybe' is not one of the allowed",
        ),
        (
            "logging.profile_steps=20000",
            "logging.profile_steps: records steps 6-20005 (after logging.summary_skip)",
        ),
    ],
)
def test_bad_values_name_the_field_and_allowed_values(override: str, message: str) -> None:
    with pytest.raises(ConfigError) as info:
        apply_overrides(TrainConfig(), [override])
    assert message in str(info.value)


def test_constructor_validates_too() -> None:
    with pytest.raises(ConfigError, match="comm: 'x' is not one of the allowed values"):
        gr00t_train.OptimizationsConfig(comm="x")
    with pytest.raises(ConfigError, match="grad_accum: must be >= 1"):
        gr00t_train.OptimConfig(grad_accum=0)


def test_graphs_need_a_graph_aware_comm_mode() -> None:
    with pytest.raises(ConfigError, match="optimizations.graph: 'per_microbatch' cannot run with comm='ddp'"):
        apply_overrides(TrainConfig(), ["optimizations.comm=ddp", "optimizations.graph=per_microbatch"])
    cfg = apply_overrides(TrainConfig(), ["optimizations.comm=overlap", "optimizations.graph=full_iteration"])
    assert cfg.optimizations.graph == "full_iteration"


def test_file_errors_are_clear(tmp_path) -> None:
    with pytest.raises(ConfigError, match="config file not found"):
        load_config(tmp_path / "missing.toml")
    (tmp_path / "bad.ini").write_text("x=1")
    with pytest.raises(ConfigError, match="unknown config format '.ini'"):
        load_config(tmp_path / "bad.ini")
    (tmp_path / "broken.toml").write_text("steps = = 3")
    with pytest.raises(ConfigError, match="broken.toml: cannot parse"):
        load_config(tmp_path / "broken.toml")
    (tmp_path / "typo.yaml").write_text("optim:\n  lrr: 1\n")
    with pytest.raises(ConfigError, match="optim.lrr: unknown setting"):
        load_config(tmp_path / "typo.yaml")
    with pytest.raises(ConfigError, match="preset: 'fast' is not one of the allowed values: demo, libero"):
        load_config(preset="fast")


def test_resolved_json_round_trips(tmp_path) -> None:
    cfg = load_config(preset="demo", overrides=["optim.lr=2e-3", "data.cameras=none", "model.tune_llm=true"])
    path = write_config_json(cfg, tmp_path / "config.json")
    assert json.loads(path.read_text())["optim"]["lr"] == 2e-3
    assert load_config(path) == cfg


def test_overrides_do_not_mutate_the_base() -> None:
    base = TrainConfig()
    apply_overrides(base, ["data.batch_size=3", "optim.lr=1"])
    assert base.data.batch_size == 16 and base.optim.lr == 1e-4


def _float_fields(cls: type, prefix: str = "") -> list[str]:
    """Dotted names of every float-valued field (tuples of floats included), found by type, not by list."""
    import dataclasses
    import typing

    hints = typing.get_type_hints(cls)
    names = []
    for field in dataclasses.fields(cls):
        hint = hints[field.name]
        if dataclasses.is_dataclass(hint):
            names += _float_fields(hint, f"{prefix}{field.name}.")
        elif float in (hint, *typing.get_args(hint)):
            names.append(f"{prefix}{field.name}")
    return names


@pytest.mark.parametrize("value", ["inf", "-inf", "nan", "1e400"])
def test_every_float_field_must_be_finite(value: str) -> None:
    # nan and inf pass every `x > 0` style range check; optim.lr=inf used to train (and produce NaN weights).
    fields = _float_fields(TrainConfig)
    assert {"optim.lr", "optim.eps", "optim.betas", "data.worker_timeout_s", "logging.peak_tflops"} <= set(
        fields
    )
    for name in fields:
        override = f"{name}=[{value}, 0.5]" if name == "optim.betas" else f"{name}={value}"
        with pytest.raises(ConfigError, match="expected a finite number") as info:
            apply_overrides(TrainConfig(), [override])
        assert info.value.field.startswith(name), (name, info.value.field)


def test_run_folder_and_data_health_settings() -> None:
    cfg = apply_overrides(
        TrainConfig(),
        ["data.worker_timeout_s=30", "data.max_bad_fraction=0", "checkpoint.existing_run=new_run"],
    )
    assert cfg.data.worker_timeout_s == 30.0 and cfg.data.max_bad_fraction == 0.0
    assert cfg.checkpoint.existing_run == "new_run"
    with pytest.raises(ConfigError, match="data.max_bad_fraction: must be in"):
        apply_overrides(TrainConfig(), ["data.max_bad_fraction=1.5"])
    with pytest.raises(ConfigError, match="data.worker_timeout_s: must be > 0"):
        apply_overrides(TrainConfig(), ["data.worker_timeout_s=0"])
    with pytest.raises(ConfigError, match="checkpoint.existing_run: 'keep' is not one of"):
        apply_overrides(TrainConfig(), ["checkpoint.existing_run=keep"])


def test_the_former_bucket_mb_key_still_loads(tmp_path, caplog) -> None:
    # optimizations.bucket_mb was renamed bucket_mib (issue 15): run configs and checkpoints written before
    # the rename load with the same value, from a file and from --set; giving both names is an error.
    old = gr00t_train.config_to_dict(TrainConfig())
    old["optimizations"]["bucket_mb"] = old["optimizations"].pop("bucket_mib") / 4
    (tmp_path / "config.json").write_text(json.dumps(old))
    with caplog.at_level("WARNING"):
        cfg = load_config(tmp_path / "config.json")
    assert cfg.optimizations.bucket_mib == 25.0 and "bucket_mib" in caplog.text
    assert apply_overrides(cfg, ["optimizations.bucket_mb=7"]).optimizations.bucket_mib == 7.0
    with pytest.raises(ConfigError, match="bucket_mib: given twice"):
        apply_overrides(cfg, ["optimizations.bucket_mb=7", "optimizations.bucket_mib=8"])


def test_bucket_mib_counts_bytes_of_the_fp32_gradient_buffers() -> None:
    from gr00t_train._comm import bucket_elements

    assert bucket_elements(100.0, torch.float32) == 26_214_400  # what `bucket_mb * 2**20 / 4` gave
    assert bucket_elements(100.0, torch.bfloat16) == 52_428_800
    assert bucket_elements(1e-9, torch.float32) == 1


def test_the_flat_optimizer_needs_zero1_and_a_gpu() -> None:
    with pytest.raises(
        ConfigError,
        match="optimizations.flat_optimizer: is DistributedAdamW's step: needs comm=zero1_overlap",
    ):
        apply_overrides(TrainConfig(), ["optimizations.flat_optimizer=on", "optimizations.comm=overlap"])
    with pytest.raises(
        ConfigError, match="optimizations.flat_optimizer: is a Triton kernel: it needs device=cuda"
    ):
        apply_overrides(
            TrainConfig(),
            ["device=cpu", "optimizations.comm=zero1_overlap", "optimizations.flat_optimizer=on"],
        )
    cfg = apply_overrides(
        TrainConfig(), ["optimizations.comm=zero1_overlap", "optimizations.flat_optimizer=on"]
    )
    assert cfg.optimizations.flat_optimizer == "on"
    assert apply_overrides(TrainConfig(), ["device=cpu"]).optimizations.flat_optimizer == "auto"  # off on CPU


@pytest.mark.parametrize(
    ("sets", "zero"),
    [
        (["device=cpu", "optimizations.comm=overlap", "optimizations.graph=per_microbatch"], False),
        (["device=cuda", "optimizations.comm=overlap", "optimizations.graph=per_microbatch"], True),
        (["device=cuda", "optimizations.graph=eager"], False),
        (["device=cuda", "optimizations.graph=eager", "optimizations.gemm_workspace=zero"], True),
        (["device=cuda", "optimizations.comm=overlap", "optimizations.graph=full_iteration",
          "optimizations.gemm_workspace=default"], False),
    ],
)  # fmt: skip
def test_which_runs_ask_cublas_for_no_workspace(sets, zero) -> None:
    from gr00t_train._backends import wants_zero_gemm_workspace

    assert wants_zero_gemm_workspace(load_config(overrides=sets)) is zero


def test_without_a_runtime_setter_the_environment_asks_for_it(monkeypatch) -> None:
    # torch 2.11 reads CUBLAS_WORKSPACE_CONFIG once; the run sets it unless the caller already did.
    from gr00t_train._backends import WORKSPACE_ENV, request_zero_gemm_workspace

    monkeypatch.delattr(torch.backends.cuda, "cublas_workspace_size", raising=False)
    monkeypatch.delenv(WORKSPACE_ENV, raising=False)
    cuda = ["device=cuda", "optimizations.comm=overlap", "optimizations.graph=per_microbatch"]
    request_zero_gemm_workspace(load_config(overrides=[*cuda, "optimizations.gemm_workspace=default"]))
    assert WORKSPACE_ENV not in os.environ
    take_out = request_zero_gemm_workspace(load_config(overrides=cuda))
    assert os.environ[WORKSPACE_ENV] == ":0:0"
    take_out()  # the run ended: processes started later do not inherit it
    assert WORKSPACE_ENV not in os.environ
    monkeypatch.setenv(WORKSPACE_ENV, ":4096:8")  # e.g. set for deterministic cuBLAS
    request_zero_gemm_workspace(load_config(overrides=cuda))
    assert os.environ[WORKSPACE_ENV] == ":4096:8"
