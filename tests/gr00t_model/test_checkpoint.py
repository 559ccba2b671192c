"""Checkpoints: our layout round-trips bit-exactly; a synthetic release-layout checkpoint maps onto the model."""

from __future__ import annotations

import json

import pytest
import torch
from gr00t_model import GR00TN16, GR00TConfig, from_pretrained, make_dummy_batch, save_pretrained
from safetensors.torch import save_file

# ---------------------------------------------------------------- release names, written out independently


def _linear(name: str, fan_out: int, fan_in: int, bias: bool = True) -> dict[str, tuple]:
    shapes = {f"{name}.weight": (fan_out, fan_in)}
    if bias:
        shapes[f"{name}.bias"] = (fan_out,)
    return shapes


def _norm(name: str, dim: int, bias: bool = True) -> dict[str, tuple]:
    return {f"{name}.weight": (dim,), **({f"{name}.bias": (dim,)} if bias else {})}


def release_shapes(c: GR00TConfig, extra_llm_layers: int = 0) -> tuple[dict[str, tuple], set[str]]:
    """Tensor names/shapes of the release's Gr00tN1d6 state dict, and which of them the model never builds."""
    shapes, unused = {}, set()
    vis = "backbone.model.vision_model.vision_model."
    d, f, p = c.vision_hidden_size, c.vision_intermediate_size, c.vision_patch_size
    shapes |= _linear(vis + "embeddings.patch_embedding", d, 3 * p * p)
    shapes[vis + "embeddings.position_embedding.weight"] = (c.vision_num_positions, d)
    for i in range(c.vision_num_layers):
        layer = f"{vis}encoder.layers.{i}."
        shapes |= _norm(layer + "layer_norm1", d) | _norm(layer + "layer_norm2", d)
        for proj in ("q_proj", "k_proj", "v_proj", "out_proj"):
            shapes |= _linear(f"{layer}self_attn.{proj}", d, d)
        shapes |= _linear(layer + "mlp.fc1", f, d) | _linear(layer + "mlp.fc2", d, f)
    shapes |= _norm(vis + "post_layernorm", d)
    head = {
        vis + "head.probe": (1, 1, d),
        vis + "head.attention.in_proj_weight": (3 * d, d),
        vis + "head.attention.in_proj_bias": (3 * d,),
    }
    head |= _linear(vis + "head.attention.out_proj", d, d) | _norm(vis + "head.layernorm", d)
    head |= _linear(vis + "head.mlp.fc1", f, d) | _linear(vis + "head.mlp.fc2", d, f)
    merged, h = 4 * d, c.llm_hidden_size
    mlp1 = "backbone.model.mlp1."
    shapes |= _norm(mlp1 + "0", merged) | _linear(mlp1 + "1", h, merged) | _linear(mlp1 + "3", h, h)
    llm = "backbone.model.language_model."
    shapes[llm + "model.embed_tokens.weight"] = (c.vocab_size, h)
    q, kv = c.llm_num_heads * c.llm_head_dim, c.llm_num_kv_heads * c.llm_head_dim
    for i in range(c.llm_num_layers + extra_llm_layers):
        layer = f"{llm}model.layers.{i}."
        names = _linear(layer + "self_attn.q_proj", q, h, False) | _linear(
            layer + "self_attn.k_proj", kv, h, False
        )
        names |= _linear(layer + "self_attn.v_proj", kv, h, False) | _linear(
            layer + "self_attn.o_proj", h, q, False
        )
        names |= _norm(layer + "self_attn.q_norm", c.llm_head_dim, False) | _norm(
            layer + "self_attn.k_norm", c.llm_head_dim, False
        )
        names |= _linear(layer + "mlp.gate_proj", c.llm_intermediate_size, h, False) | _linear(
            layer + "mlp.up_proj", c.llm_intermediate_size, h, False
        )
        names |= _linear(layer + "mlp.down_proj", h, c.llm_intermediate_size, False)
        names |= _norm(layer + "input_layernorm", h, False) | _norm(
            layer + "post_attention_layernorm", h, False
        )
        shapes |= names
        if i >= c.llm_num_layers:
            unused |= set(names)
    shapes |= _norm(llm + "model.norm", h, False)
    lm_head = {llm + "lm_head.weight": (c.vocab_size, h)}
    w, hid, E = c.input_embedding_dim, c.hidden_size, c.max_num_embodiments
    dit = "action_head.model."
    # the release fixes the timestep sinusoid at 256 channels and the feed-forward at 4x (not in config.json)
    shapes |= _linear(dit + "timestep_encoder.timestep_embedder.linear_1", w, 256)
    shapes |= _linear(dit + "timestep_encoder.timestep_embedder.linear_2", w, w)
    for i in range(c.dit_num_layers):
        block, source = f"{dit}transformer_blocks.{i}.", w if i % 2 else h
        shapes |= _linear(block + "norm1.linear", 2 * w, w) | _linear(block + "attn1.to_q", w, w)
        shapes |= _linear(block + "attn1.to_k", w, source) | _linear(block + "attn1.to_v", w, source)
        shapes |= _linear(block + "attn1.to_out.0", w, w)
        shapes |= _linear(block + "ff.net.0.proj", 4 * w, w) | _linear(block + "ff.net.2", w, 4 * w)
    shapes |= _linear(dit + "proj_out_1", 2 * w, w) | _linear(dit + "proj_out_2", hid, w)

    def per_embodiment(name, fan_in, fan_out):
        return {f"action_head.{name}.W": (E, fan_in, fan_out), f"action_head.{name}.b": (E, fan_out)}

    shapes |= per_embodiment("state_encoder.layer1", c.max_state_dim, hid) | per_embodiment(
        "state_encoder.layer2", hid, w
    )
    shapes |= per_embodiment("action_encoder.W1", c.max_action_dim, w) | per_embodiment(
        "action_encoder.W2", 2 * w, w
    )
    shapes |= per_embodiment("action_encoder.W3", w, w)
    shapes |= per_embodiment("action_decoder.layer1", hid, hid) | per_embodiment(
        "action_decoder.layer2", hid, c.max_action_dim
    )
    shapes |= _norm("action_head.vlln", h) | {"action_head.position_embedding.weight": (c.max_seq_len, w)}
    return shapes | head | lm_head, unused | set(head) | set(lm_head)


def ours_from_release(name: str) -> str:
    for theirs, ours in (
        ("backbone.model.vision_model.vision_model.", "backbone.vision_model."),
        ("backbone.model.mlp1.", "backbone.mlp1."),
        ("backbone.model.language_model.model.", "backbone.language_model."),
    ):
        if name.startswith(theirs):
            return ours + name[len(theirs) :]
    return name


RELEASE_CONFIG = {  # what the release's save_pretrained writes (action-head fields only), tiny-sized
    "model_type": "Gr00tN1d6",
    "model_name": "nvidia/Eagle-Block2A-2B-v2",
    "backbone_embedding_dim": 64,
    "select_layer": 2,
    "tune_top_llm_layers": 1,
    "tune_llm": False,
    "tune_visual": False,
    "action_horizon": 12,
    "max_state_dim": 48,
    "max_action_dim": 40,
    "hidden_size": 64,
    "input_embedding_dim": 64,
    "max_num_embodiments": 32,
    "max_seq_len": 64,
    "use_vlln": True,
    "add_pos_embed": True,
    "use_alternate_vl_dit": True,
    "attend_text_every_n_blocks": 2,
    "diffusion_model_cfg": {
        "num_layers": 4,
        "num_attention_heads": 4,
        "attention_head_dim": 16,
        "dropout": 0.2,
        "output_dim": 64,
    },
    "num_inference_timesteps": 4,
    "apply_sincos_state_encoding": True,
    "model_dtype": "bfloat16",
}


@pytest.fixture
def release_dir(tmp_path):
    """A two-shard release-layout checkpoint (bf16, official names, unused tensors included)."""
    base = GR00TConfig.preset("tiny", frozen_dtype="bfloat16", compute_dtype="bfloat16")  # the release policy
    target = base.replace(action_horizon=12, max_state_dim=48, max_action_dim=40)
    shapes, unused = release_shapes(target, extra_llm_layers=1)
    gen = torch.Generator().manual_seed(1)
    tensors = {k: torch.randn(s, generator=gen).to(torch.bfloat16) for k, s in shapes.items()}
    names = sorted(tensors)
    shards = {
        "model-00001-of-00002.safetensors": names[: len(names) // 2],
        "model-00002-of-00002.safetensors": names[len(names) // 2 :],
    }
    for file, keys in shards.items():
        save_file({k: tensors[k] for k in keys}, str(tmp_path / file))
    index = {"weight_map": {k: f for f, keys in shards.items() for k in keys}}
    (tmp_path / "model.safetensors.index.json").write_text(json.dumps(index))
    (tmp_path / "config.json").write_text(json.dumps(RELEASE_CONFIG))
    return tmp_path, base, tensors, unused


def test_release_checkpoint_maps_every_tensor(release_dir) -> None:
    path, base, tensors, unused = release_dir
    model, report = from_pretrained(path, config=base, return_report=True)
    c = model.config
    assert (c.action_horizon, c.max_state_dim, c.max_action_dim, c.llm_num_layers, c.tune_top_llm_layers) == (
        12,
        48,
        40,
        2,
        1,
    )
    assert report.layout == "official" and report.missing == [] and report.unexpected == []
    assert set(report.ignored) == unused
    assert report.loaded == len(tensors) - len(unused) == len(model.state_dict())
    params = model.state_dict()
    for name, value in tensors.items():
        if name not in unused:
            ours = params[ours_from_release(name)]
            assert torch.equal(ours, value.to(ours.dtype)), name
    # precision policy after loading: trainable fp32 (exact copies of the bf16 values), frozen bf16
    assert params["action_head.model.proj_out_2.weight"].dtype == torch.float32
    assert params["backbone.vision_model.post_layernorm.weight"].dtype == torch.bfloat16
    batch = make_dummy_batch(c, 2)
    assert torch.isfinite(model(batch)["loss"])


def test_release_checkpoint_whose_sizes_match_no_preset(tmp_path) -> None:
    """A release-layout checkpoint loaded on the tiny backbone: the DiT sizes come from its config.json, the
    sizes the release fixes in code (timestep width 256, feed-forward 4x) never from the base preset."""
    base = GR00TConfig.preset("tiny")
    config = {
        **RELEASE_CONFIG,
        "hidden_size": 96,
        "input_embedding_dim": 48,
        "action_horizon": 10,
        "max_seq_len": 32,
        "diffusion_model_cfg": {
            **RELEASE_CONFIG["diffusion_model_cfg"],
            "num_layers": 6,
            "num_attention_heads": 3,
            "attention_head_dim": 16,
            "output_dim": 96,
        },
    }
    target = base.replace(
        hidden_size=96, input_embedding_dim=48, action_horizon=10, max_seq_len=32, dit_num_layers=6,
        dit_num_heads=3, max_state_dim=48, max_action_dim=40, timestep_channels=256, dit_ff_mult=4,
    )  # fmt: skip
    presets = [GR00TConfig.preset(name) for name in ("tiny", "n1.6-3b", "n1.6-code-defaults")]
    assert all(target.replace(name=p.name) != p for p in presets)  # matches no preset
    shapes, unused = release_shapes(target)
    gen = torch.Generator().manual_seed(2)
    tensors = {k: torch.randn(s, generator=gen) for k, s in shapes.items()}
    save_file(tensors, str(tmp_path / "model.safetensors"))
    (tmp_path / "config.json").write_text(json.dumps(config))
    model, report = from_pretrained(tmp_path, config=base, return_report=True)
    c = model.config
    assert (c.timestep_channels, c.dit_ff_mult, c.hidden_size, c.dit_num_layers) == (256, 4, 96, 6)
    assert report.missing == [] and report.unexpected == [] and set(report.ignored) == unused
    ours = model.state_dict()["action_head.model.timestep_encoder.timestep_embedder.linear_1.weight"]
    assert ours.shape == (48, 256)
    assert torch.equal(ours, tensors["action_head.model.timestep_encoder.timestep_embedder.linear_1.weight"])
    assert torch.isfinite(model(make_dummy_batch(c, 2))["loss"])


def test_official_layout_refuses_sizes_the_release_cannot_record(tmp_path) -> None:
    model = GR00TN16(GR00TConfig.preset("tiny"))  # timestep_channels 32: not the release's 256
    with pytest.raises(ValueError, match="release layout cannot record .*timestep_channels"):
        save_pretrained(model, tmp_path / "ckpt", layout="official")
    assert not (tmp_path / "ckpt").exists()  # refused before any file was written


def test_release_checkpoint_problems_are_reported(release_dir, caplog) -> None:
    path, base, tensors, _ = release_dir
    from safetensors.torch import load_file

    shard = path / "model-00002-of-00002.safetensors"
    content = load_file(str(shard))
    dropped = sorted(content)[0]
    del content[dropped]
    content["action_head.not_a_module.weight"] = torch.zeros(3)
    save_file(content, str(shard))
    index = json.loads((path / "model.safetensors.index.json").read_text())
    index["weight_map"].pop(dropped)
    index["weight_map"]["action_head.not_a_module.weight"] = shard.name
    (path / "model.safetensors.index.json").write_text(json.dumps(index))
    model, report = from_pretrained(path, config=base, return_report=True)
    assert report.missing == [ours_from_release(dropped)]
    assert report.unexpected == ["action_head.not_a_module.weight"]
    assert "1 missing, 1 unexpected" in caplog.text and "missing (1)" in str(report)
    with pytest.raises(KeyError, match="strict load failed"):
        from_pretrained(path, config=base, strict=True)


def test_shape_mismatch_names_the_tensor(release_dir) -> None:
    path, base, _, _ = release_dir
    with pytest.raises(
        ValueError,
        match=r"model-0000\d-of-00002.safetensors: action_head\.\S+ has shape \(.*\), model expects",
    ):
        from_pretrained(path, config=base, hidden_size=32)


def _assert_identical(a: torch.nn.Module, b: torch.nn.Module) -> None:
    sa, sb = a.state_dict(), b.state_dict()
    assert sa.keys() == sb.keys()
    for name in sa:
        assert sa[name].dtype == sb[name].dtype and torch.equal(sa[name], sb[name]), name
    assert {n for n, p in a.named_parameters() if p.requires_grad} == {
        n for n, p in b.named_parameters() if p.requires_grad
    }


@pytest.mark.parametrize("layout", ["gr00t_model", "official"])
def test_save_load_round_trip_is_bit_exact(tmp_path, layout) -> None:
    config = GR00TConfig.preset(
        "tiny", action_horizon=8, state_dropout_prob=0.1, frozen_dtype="bfloat16", compute_dtype="bfloat16"
    )
    if layout == "official":  # the release layout records only what the release can vary
        config = config.replace(timestep_channels=256, dit_ff_mult=4)
    model = GR00TN16(config)
    with torch.no_grad():
        model.action_head.vlln.weight.add_(0.123)  # not an init value
    save_pretrained(model, tmp_path, layout=layout, max_shard_bytes=1 << 20)  # several shards
    assert len(list(tmp_path.glob("*.safetensors"))) > 1 and not list(tmp_path.glob("*.tmp"))
    loaded, report = GR00TN16.from_pretrained(
        tmp_path, return_report=True, config=config if layout == "official" else None
    )
    assert report.missing == report.unexpected == report.ignored == []
    assert loaded.config == config
    _assert_identical(model, loaded)
    batch = make_dummy_batch(config, 2)
    noise, t = torch.randn(2, 8, config.max_action_dim), torch.tensor([0.1, 0.7])
    model.eval(), loaded.eval()
    assert torch.equal(model(batch, noise=noise, t=t)["loss"], loaded(batch, noise=noise, t=t)["loss"])


def test_single_file_checkpoint_and_bad_directories(tmp_path) -> None:
    model = GR00TN16(GR00TConfig.preset("tiny"))
    model.save_pretrained(tmp_path / "ckpt")
    assert sorted(p.name for p in (tmp_path / "ckpt").iterdir()) == ["config.json", "model.safetensors"]
    _assert_identical(model, from_pretrained(tmp_path / "ckpt"))
    with pytest.raises(FileNotFoundError, match="config.json"):
        from_pretrained(tmp_path)
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "llama"}))
    with pytest.raises(ValueError, match="neither a gr00t_model checkpoint"):
        from_pretrained(tmp_path)
    (tmp_path / "config.json").write_text(
        json.dumps({"model_type": "Gr00tN1d6", "use_alternate_vl_dit": False})
    )
    with pytest.raises(ValueError, match="use_alternate_vl_dit"):
        from_pretrained(tmp_path)
