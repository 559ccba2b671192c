"""data.prefix_cache: training from stored features of the frozen prefix against training from video.

The stored features are the only difference between a cached and an uncached run, so each comparison is
exact: where the store keeps the features' own bits (bf16 features in a bf16 store, any in an fp32 store)
the losses are equal bit for bit; where it rounds them (fp32 features in bf16, fp8), they equal a run from
video whose prefix is rounded the same way, bit for bit, and the rounding itself stays within the stored
dtype's unit roundoff. Tiny model, a 2-episode synthetic dataset, CPU."""

from __future__ import annotations

import dataclasses
import json
import shutil

import gr00t_model
import gr00t_train
import numpy as np
import pytest
import torch
from gr00t_train import ConfigError, Trainer
from gr00t_train.model import build as _build
from gr00t_train.prefix_cache import cache as _prefix_cache
from gr00t_train.prefix_cache.source import CachedSource
from gr00t_train.prefix_cache.store import FeatureStore, dequantize, quantize


@pytest.fixture(scope="module")
def dataset(tmp_path_factory):
    """2 episodes x 16 frames, two 64x64 H.264 cameras."""
    import vla_io

    root = tmp_path_factory.mktemp("data") / "libero-like"
    vla_io.write_synthetic_dataset(
        root, vla_io.testing.SynthConfig(episodes=2, episode_length=16, image_size=64, codec="h264")
    )
    return root


def _cfg(dataset, out, *sets):
    base = [
        f"data.dataset={dataset}",
        f"output_dir={out}",
        "device=cpu",
        "steps=4",
        "data.batch_size=4",
        "data.num_workers=1",
        "data.val_episodes=0",
        "eval.every=0",
        "logging.every=1",
        "logging.progress=false",
        "logging.plots=false",
        "checkpoint.save_final=false",
    ]
    return gr00t_train.load_config(preset="demo", overrides=[*base, *sets])


def _losses(cfg) -> list[float]:
    with open(f"{cfg.output_dir}/metrics.jsonl") as lines:
        rows = [json.loads(line) for line in lines]
    return [row["loss"] for row in rows if "kind" not in row]


def _fit(cfg, env, parts=None) -> list[float]:
    Trainer(cfg, parts or _build.build_parts(cfg, env), env).fit()
    return _losses(cfg)


# ------------------------------------------------------------------------------------------ equality
@pytest.mark.parametrize(
    ("precision", "dtype"),
    [("bf16", "bf16"), ("bf16", "fp32"), ("fp32", "fp32")],
    ids=["bf16-features-bf16-store", "bf16-features-fp32-store", "fp32-features-fp32-store"],
)
def test_a_lossless_store_trains_bit_for_bit_like_video(dataset, tmp_path, env, precision, dtype) -> None:
    plain = _fit(_cfg(dataset, tmp_path / "plain", f"precision={precision}"), env)
    cached_cfg = _cfg(
        dataset, tmp_path / "cached", f"precision={precision}", "data.prefix_cache.mode=memory",
        f"data.prefix_cache.dtype={dtype}",
    )  # fmt: skip
    parts = _build.build_parts(cached_cfg, env)
    assert isinstance(parts.data, CachedSource) and parts.facts["prefix_cache"]["samples"] > 0
    cached = _fit(cached_cfg, env, parts)
    assert len(plain) == 4 and cached == plain


@pytest.mark.parametrize("dtype", ["bf16", "fp8"])
def test_a_rounding_store_trains_like_video_with_that_rounding(dataset, tmp_path, env, dtype) -> None:
    """fp32 features: the cached run equals a run from video whose loss rounds the prefix as the store does."""
    sets = ("precision=fp32",)
    reference_cfg = _cfg(dataset, tmp_path / "reference", *sets)
    parts = _build.build_parts(reference_cfg, env)
    model = parts.model

    def rounded_loss(module, batch, prefix=None):
        features = model.prefix_features(batch)
        stored, scale = quantize(features["hidden"], dtype)
        features["hidden"] = dequantize(stored, scale, features["hidden"].dtype)
        return module(batch, noise=batch["noise"], t=batch["t"], prefix=model.prefix_from_features(features))[
            "loss"
        ]

    parts.loss_fn = rounded_loss
    reference = _fit(reference_cfg, env, parts)
    cached_cfg = _cfg(
        dataset,
        tmp_path / "cached",
        *sets,
        "data.prefix_cache.mode=memory",
        f"data.prefix_cache.dtype={dtype}",
    )
    cached = _fit(cached_cfg, env)
    plain = _fit(_cfg(dataset, tmp_path / "plain", *sets), env)
    assert cached == reference
    assert cached != plain  # the rounding is real ...
    assert np.allclose(cached, plain, rtol=1e-2)  # ... and small (the bound is derived below)


@pytest.mark.parametrize(("dtype", "unit"), [("bf16", 2.0**-8), ("fp8", 2.0**-4)])
def test_stored_features_and_the_loss_stay_within_the_dtypes_rounding(dtype: str, unit: float) -> None:
    """Rounding to nearest keeps each stored value within the dtype's unit roundoff `unit` of it, relative
    (bf16: 8 significant bits, 2^-8; fp8 e4m3: 4 bits, 2^-4, on values divided by their token's scale),
    plus for fp8 half of e4m3's subnormal spacing, 2^-10 of the scale, below its smallest normal. The loss
    then moves by at most the first-order bound sum |dL/dh| x (that bound on |dh|), doubled for the second
    order."""
    config = gr00t_model.GR00TConfig.preset("tiny", frozen_dtype="float32", compute_dtype=None)
    model = gr00t_model.GR00TN16(config).train()
    model.action_head.model.eval()  # no dropout: two calls compute the same function
    batch = gr00t_model.make_dummy_batch(config, 3, num_images=2, seed=1)
    gen = torch.Generator().manual_seed(3)
    noise = torch.randn(3, config.action_horizon, config.max_action_dim, generator=gen)
    t = torch.rand(3, generator=gen) * 0.999
    features = model.prefix_features(batch)
    hidden = features["hidden"]
    stored, scale = quantize(hidden, dtype)
    restored = dequantize(stored, scale, hidden.dtype)

    floor = 0.0 if scale is None else scale[..., None] * 2.0**-10
    allowed = unit * hidden.abs() * (1 + 2.0**-20) + floor  # 2^-20: the fp32 divide and multiply around it
    assert bool(((restored - hidden).abs() <= allowed).all())

    leaf = hidden.clone().requires_grad_(True)
    loss = model.forward_from_prefix({**features, "hidden": leaf}, batch, noise, t)["loss"]
    (grad,) = torch.autograd.grad(loss, leaf)
    with torch.no_grad():
        moved = model.forward_from_prefix({**features, "hidden": restored}, batch, noise, t)["loss"]
    bound = float((grad.abs() * allowed).sum())
    assert 0 < abs(float(moved - loss.detach())) <= 2 * bound


# ------------------------------------------------------------------------------------------ variants
def _store(variants: int, samples: int) -> FeatureStore:
    """A hand-made cache whose hidden value says (variant, sample): 100 x variant + sample."""
    layout = {
        "hidden": ([variants, samples, 3, 2], "float32"),
        "valid": ([samples, 3], "bool"),
        "image_mask": ([samples, 3], "bool"),
        "state": ([samples, 1, 4], "float32"),
    }
    meta = {
        "layout": layout,
        "variants": variants,
        "num_samples": samples,
        "fingerprint": "f",
        "dtype": "fp32",
    }
    store = FeatureStore.create(meta, None)
    values = 100 * torch.arange(variants)[:, None] + torch.arange(samples)[None, :]
    store.arrays["hidden"].copy_(values[:, :, None, None].float().expand(-1, -1, 3, 2))
    store.arrays["state"].copy_(torch.arange(samples).float()[:, None, None].expand(-1, 1, 4))
    return store


def test_variants_cycle_by_epoch_in_the_pipelines_order_and_resume() -> None:
    import vla_io

    store = _store(variants=3, samples=10)
    source = CachedSource(
        store, batch_size=4, seed=7, shuffle=True, rank=0, world_size=1, device=torch.device("cpu")
    )
    sampler = vla_io.EpochSampler(10, 4, seed=7, shuffle=True, drop_last=True)  # the video pipeline's order
    seen = []
    for epoch in range(4):
        for index in range(sampler.batches_per_epoch):
            batch = next(source)
            rows = torch.from_numpy(sampler.task(epoch, index).indices).float()
            assert torch.equal(batch["prefix_hidden"][:, 0, 0], 100 * (epoch % 3) + rows)
            assert torch.equal(batch["state"][:, 0, 0], rows)  # per-sample arrays do not vary
            seen.append(batch["prefix_hidden"].clone())
            if (epoch, index) == (1, 0):
                saved = source.state_dict()
    source.close()

    resumed = CachedSource(
        store, batch_size=4, seed=7, shuffle=True, rank=0, world_size=1, device=torch.device("cpu")
    )
    resumed.load_state_dict(saved)
    again = [next(resumed)["prefix_hidden"] for _ in range(len(seen) - 3)]
    resumed.close()
    assert all(torch.equal(a, b) for a, b in zip(again, seen[3:]))
    # At another batch size the epoch continues at the place the saved run had reached: its rest, in order.
    halves = CachedSource(
        store, batch_size=2, seed=7, shuffle=True, rank=0, world_size=1, device=torch.device("cpu")
    )
    halves.load_state_dict(saved)
    rest = torch.cat([next(halves)["prefix_hidden"][:, 0, 0] for _ in range(2)])  # places 4-7 of epoch 1
    halves.close()
    assert torch.equal(rest, 100 + torch.from_numpy(sampler.order(1)[4:8]).float())
    with pytest.raises(ValueError, match="seed=7"):
        CachedSource(
            store, batch_size=4, seed=8, shuffle=True, rank=0, world_size=1, device=torch.device("cpu")
        ).load_state_dict(saved)


def test_augmented_variants_differ_and_rebuild_identically(dataset, tmp_path, env) -> None:
    sets = ("data.augment=true", "data.prefix_cache.mode=memory", "data.prefix_cache.variants=2")
    first = _build.build_parts(_cfg(dataset, tmp_path / "a", *sets), env).data.store
    second = _build.build_parts(_cfg(dataset, tmp_path / "b", *sets), env).data.store
    hidden = first.arrays["hidden"]
    assert hidden.shape[0] == 2 and not torch.equal(hidden[0], hidden[1])  # two crops / jitters per sample
    assert all(torch.equal(first.arrays[k], second.arrays[k]) for k in first.arrays)  # seeded
    plain = _build.build_parts(_cfg(dataset, tmp_path / "c", "data.prefix_cache.mode=memory"), env).data.store
    assert not torch.equal(plain.arrays["hidden"][0], hidden[0])  # augmentation off: the centre crop


# -------------------------------------------------------------------------------- reuse and rebuild
def test_a_disk_cache_is_reused_and_a_change_builds_another(dataset, tmp_path, env) -> None:
    sets = ("data.prefix_cache.mode=disk", f"data.prefix_cache.dir={tmp_path / 'caches'}")
    first = _build.build_parts(_cfg(dataset, tmp_path / "a", *sets), env).facts["prefix_cache"]
    assert not first["reused"] and first["bytes"] > 0 and first["build_s"] > 0
    again = _build.build_parts(_cfg(dataset, tmp_path / "b", *sets), env).facts["prefix_cache"]
    assert again["reused"] and again["folder"] == first["folder"] and again["build_s"] == 0
    assert not list((tmp_path / "caches").glob(".tmp-*"))  # nothing half-written left behind

    # The stored dtype, how many LLM layers are frozen, the frozen weights (random ones come from the seed).
    folders = {first["folder"]}
    for change in ["data.prefix_cache.dtype=fp8", "model.tune_top_llm_layers=0", "seed=3"]:
        facts = _build.build_parts(_cfg(dataset, tmp_path / "c", *sets, change), env).facts["prefix_cache"]
        assert not facts["reused"], change
        folders.add(facts["folder"])
    assert len(folders) == 4
    # What only the trainable part or the loop sees changes nothing stored.
    others = ("optim.lr=0.01", "data.num_workers=0", "model.lora.rank=2")
    facts = _build.build_parts(_cfg(dataset, tmp_path / "c", *sets, *others), env).facts["prefix_cache"]
    assert facts["reused"] and facts["folder"] == first["folder"]

    default = _build.build_parts(_cfg(dataset, tmp_path / "d", "data.prefix_cache.mode=disk"), env)
    assert default.facts["prefix_cache"]["folder"].startswith(str(tmp_path / "d" / "prefix_cache"))


def test_an_incomplete_cache_folder_is_rebuilt(dataset, tmp_path, env) -> None:
    sets = ("data.prefix_cache.mode=disk", f"data.prefix_cache.dir={tmp_path / 'caches'}")
    first = _build.build_parts(_cfg(dataset, tmp_path / "a", *sets), env).facts["prefix_cache"]
    (tmp_path / "caches" / first["folder"].rsplit("/", 1)[1] / "meta.json").unlink()  # as if cut short
    again = _build.build_parts(_cfg(dataset, tmp_path / "b", *sets), env).facts["prefix_cache"]
    assert not again["reused"] and again["folder"] == first["folder"]


def test_a_cached_run_resumes_bit_for_bit(dataset, tmp_path, env) -> None:
    sets = ("data.prefix_cache.mode=disk", f"data.prefix_cache.dir={tmp_path / 'caches'}", "steps=6")
    whole = _fit(_cfg(dataset, tmp_path / "whole", *sets), env)
    _fit(_cfg(dataset, tmp_path / "cut", *sets, "checkpoint.every=3"), env)
    step3 = tmp_path / "cut/checkpoints/step_000003"
    resumed = _fit(_cfg(dataset, tmp_path / "cut", *sets, f"checkpoint.resume={step3}"), env)
    assert len(whole) == 6 and resumed == whole


# --------------------------------------------------------------------------------------- refusals
@pytest.mark.parametrize(
    ("sets", "field", "words"),
    [
        (
            ["model.tune_visual=true"],
            "data.prefix_cache.mode",
            "model.tune_visual=true trains the vision tower",
        ),
        (
            ["model.tune_llm=true"],
            "data.prefix_cache.mode",
            "model.tune_llm=true trains the token embeddings",
        ),
        (["data.prefix_cache.variants=2"], "data.prefix_cache.variants", "data.augment is false"),
    ],
)
def test_settings_a_cache_cannot_serve_are_refused_before_the_model(
    dataset, tmp_path, env, sets, field, words
):
    cfg = _cfg(dataset, tmp_path, "data.prefix_cache.mode=memory", *sets)
    with pytest.raises(ConfigError, match=words) as caught:
        _prefix_cache.check_settings(cfg, env)
    assert caught.value.field == field


def test_memory_with_more_processes_several_hosts_and_a_folder_in_the_dataset_are_refused(
    dataset, tmp_path, env, monkeypatch
) -> None:
    two = dataclasses.replace(env, world_size=2)
    with pytest.raises(ConfigError, match="memory keeps the cache in one process; with 2 processes use disk"):
        _prefix_cache.check_settings(_cfg(dataset, tmp_path, "data.prefix_cache.mode=memory"), two)
    _prefix_cache.check_settings(_cfg(dataset, tmp_path, "data.prefix_cache.mode=disk"), two)  # one host
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "1")
    with pytest.raises(ConfigError, match="disk builds the cache on one host; this run has processes on 2"):
        _prefix_cache.check_settings(_cfg(dataset, tmp_path, "data.prefix_cache.mode=disk"), two)
    inside = _cfg(
        dataset, tmp_path, "data.prefix_cache.mode=disk", f"data.prefix_cache.dir={dataset / 'cache'}"
    )
    with pytest.raises(ConfigError, match="data.prefix_cache.dir: .* inside the dataset folder"):
        _prefix_cache.check_settings(inside, env)
    assert not (dataset / "cache").exists()


def test_a_trainable_module_inside_the_prefix_is_refused(dataset, tmp_path, env) -> None:
    cfg = _cfg(
        dataset, tmp_path, "data.prefix_cache.mode=memory", "model.lora.rank=2",
        "model.lora.train_in_full=[backbone.mlp1]",
    )  # fmt: skip
    with pytest.raises(ConfigError, match="data.prefix_cache.mode: memory needs a frozen vision tower"):
        _build.build_parts(cfg, env)


def test_the_command_exits_2_naming_the_setting(dataset, tmp_path, capsys) -> None:
    from gr00t_train.cli import main

    args = ["train", "--preset", "demo"]
    for item in (f"data.dataset={dataset}", f"output_dir={tmp_path}", "device=cpu", "model.tune_visual=true",
                 "data.prefix_cache.mode=disk"):  # fmt: skip
        args += ["--set", item]
    assert main(args) == 2
    assert "data.prefix_cache.mode: disk stores the frozen prefix's output" in capsys.readouterr().err


def test_a_resume_may_move_the_cache_but_not_switch_it() -> None:
    from gr00t_train.checkpoint.resume_changes import config_changes
    from gr00t_train.config.io import config_to_dict

    saved = config_to_dict(gr00t_train.load_config(preset="demo", overrides=["device=cpu"]))
    kinds = {}
    for change in (
        "data.prefix_cache.mode=disk",
        "data.prefix_cache.dir=/elsewhere",
        "data.prefix_cache.variants=2",
    ):
        cfg = gr00t_train.load_config(preset="demo", overrides=["device=cpu", "data.augment=true", change])
        kinds.update(
            {c.key: c.kind for c in config_changes(saved, cfg, "cpu") if c.key.startswith("data.prefix")}
        )
    assert kinds == {
        "data.prefix_cache.mode": "trajectory",  # other training data: --resume-changed allows it
        "data.prefix_cache.dir": "harmless",
        "data.prefix_cache.variants": "trajectory",
    }


@pytest.mark.parametrize("dtype", ["bf16", "fp8"])
def test_a_build_that_cannot_fit_is_refused_before_it_starts(
    dataset, tmp_path, env, monkeypatch, dtype
) -> None:
    cfg = _cfg(dataset, tmp_path / "a", "data.prefix_cache.mode=memory", f"data.prefix_cache.dtype={dtype}")
    store = _build.build_parts(cfg, env).data.store
    needed = store.arrays["hidden"].nbytes + (store.arrays["scale"].nbytes if dtype == "fp8" else 0)
    monkeypatch.setattr(_prefix_cache, "_available_memory", lambda: needed)  # 90% of it is all a build takes
    with pytest.raises(ConfigError, match="data.prefix_cache.mode: memory: the cache needs .* host memory"):
        _build.build_parts(
            _cfg(
                dataset, tmp_path / "b", "data.prefix_cache.mode=memory", f"data.prefix_cache.dtype={dtype}"
            ),
            env,
        )


def test_a_build_cut_short_leaves_nothing_usable(dataset, tmp_path, env, monkeypatch) -> None:
    """A build stopped half-way removes its temporary folder; one whose process was killed is removed by the
    next build of the same cache. Neither ever looks like a complete cache."""
    from gr00t_train.prefix_cache import build as _prefix_cache_build

    sets = ("data.prefix_cache.mode=disk", f"data.prefix_cache.dir={tmp_path / 'caches'}")
    original, calls = _prefix_cache_build.FeatureStore.write, []

    def write_then_stop(self, *args, **kwargs):
        calls.append(1)
        if len(calls) > 3:
            raise KeyboardInterrupt  # as if stopped while writing
        return original(self, *args, **kwargs)

    monkeypatch.setattr(_prefix_cache_build.FeatureStore, "write", write_then_stop)
    with pytest.raises(KeyboardInterrupt):
        _build.build_parts(_cfg(dataset, tmp_path / "a", *sets), env)
    monkeypatch.undo()
    assert not list((tmp_path / "caches").iterdir())

    name = _build.build_parts(_cfg(dataset, tmp_path / "b", *sets), env).facts["prefix_cache"]["folder"]
    name = name.rsplit("/", 1)[1]
    shutil.rmtree(tmp_path / "caches" / name)
    killed = tmp_path / "caches" / f".tmp-{name}-999999999"  # a process id that is not running
    killed.mkdir()
    (killed / "hidden.bin").write_bytes(b"partial")
    facts = _build.build_parts(_cfg(dataset, tmp_path / "c", *sets), env).facts["prefix_cache"]
    assert not facts["reused"] and [p.name for p in (tmp_path / "caches").iterdir()] == [name]
