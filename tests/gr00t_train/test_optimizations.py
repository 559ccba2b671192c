"""`auto` speed switches: what they resolve to per device, the start-up line, and configs written before."""

from __future__ import annotations

import gr00t_train
import pytest
from gr00t_train import ConfigError, TrainConfig, load_config
from gr00t_train._bench import LADDER
from gr00t_train.config.optimizations import resolve_optimizations

HOPPER, VOLTA = (9, 0), (7, 0)


def _ladder_row(name: str) -> list[str]:
    """The cumulative switches of the ladder up to and including row `name`."""
    switches: list[str] = []
    for row, changes in LADDER:
        switches += changes
        if row == name:
            return switches
    raise AssertionError(f"no ladder row {name}")


def test_defaults_on_a_gpu_are_the_ladders_last_exact_row() -> None:
    plain, line = resolve_optimizations(TrainConfig(), "cuda", HOPPER)
    ladder, _ = resolve_optimizations(load_config(overrides=_ladder_row("+ staged update")), "cuda", HOPPER)
    assert plain.optimizations == ladder.optimizations
    assert plain.precision == "bf16"
    assert "graph=per_microbatch" in line and "off: fp8_frozen (changes the numerics" in line


def test_defaults_on_a_cpu_are_the_simple_path() -> None:
    cfg, line = resolve_optimizations(TrainConfig(), "cpu")
    opts = cfg.optimizations
    assert (opts.comm, opts.graph, opts.compile, opts.bf16_weights) == ("overlap", "eager", "off", "off")
    assert (opts.optimizer_overlap, opts.flat_optimizer, opts.triton_attention) == ("off", "off", "off")
    assert cfg.precision == "auto"  # the model preset's own choice on a CPU
    assert "on: none" in line and "(needs CUDA)" in line


def test_what_the_user_set_is_kept_and_named_in_the_line() -> None:
    cfg = load_config(overrides=["optimizations.comm=ddp", "optimizations.compile=off"])
    resolved, line = resolve_optimizations(cfg, "cuda", HOPPER)
    opts = resolved.optimizations
    assert (opts.comm, opts.graph, opts.compile, opts.bf16_weights) == ("ddp", "eager", "off", "off")
    assert "graph (torch DDP (comm=ddp) cannot run in graphs)" in line
    assert "compile (set to off)" in line
    assert "bf16_weights, flat_optimizer, skip_untouched_rows (needs comm=zero1_overlap)" in line


def test_an_old_gpu_gets_fp32_and_no_bf16_kernels() -> None:
    cfg, line = resolve_optimizations(TrainConfig(), "cuda", VOLTA)
    opts = cfg.optimizations
    assert cfg.precision == "fp32" and opts.bf16_weights == "off" and opts.triton_attention == "off"
    assert opts.graph == "per_microbatch" and opts.compile == "on"
    assert "needs compute capability 8.0+" in line


def test_resolving_twice_changes_nothing() -> None:
    for device, capability in (("cpu", None), ("cuda", HOPPER), ("cuda", VOLTA)):
        once, line = resolve_optimizations(TrainConfig(), device, capability)
        twice, again = resolve_optimizations(once, device, capability)
        assert twice == once and again == line


@pytest.mark.parametrize(("given", "expected"), [(True, "on"), (False, "off"), ("true", "on"), ("no", "off")])
def test_true_and_false_read_as_on_and_off(given, expected) -> None:
    """Configs and checkpoints written when bf16_weights and optimizer_overlap were booleans still load."""
    opts = gr00t_train.OptimizationsConfig(bf16_weights=given, optimizer_overlap=given, comm="zero1_overlap")
    assert opts.bf16_weights == expected and opts.optimizer_overlap == expected


def test_bf16_weights_on_still_needs_the_sharded_optimizer() -> None:
    with pytest.raises(ConfigError, match="bf16_weights: needs comm=zero1_overlap"):
        load_config(overrides=["optimizations.bf16_weights=on", "optimizations.comm=overlap"])
    cfg, _ = resolve_optimizations(load_config(overrides=["optimizations.bf16_weights=on"]), "cpu")
    assert cfg.optimizations.comm == "zero1_overlap" and cfg.precision == "bf16"
