"""The processor: normalization round trips, prompt and tokens, padding and masks, images, end to end with the model."""

from __future__ import annotations

import json

import pytest
import torch
from gr00t_model import (
    GR00TN16,
    EmbodimentSpec,
    GR00TConfig,
    GR00TProcessor,
    ImageSpec,
    JointGroup,
    ProcessorConfig,
    load_tokenizer,
    preprocess_images,
    relative_action_stats,
)
from gr00t_model._tokenizer import TOKENIZER_FILE, build_tiny_tokenizer

TINY = GR00TConfig.preset("tiny")
TASK = "Pick the pear from the counter, and place it in the plate!"


@pytest.fixture
def gr1(dataset_meta) -> EmbodimentSpec:
    return EmbodimentSpec.from_lerobot_meta(dataset_meta, "gr1", action_horizon=16)


def _raw(spec: EmbodimentSpec, *shape: int, margin: float = 0.0) -> torch.Tensor:
    """Random raw states ([B]) or action chunks ([B, T]) inside each group's [min, max], or beyond by `margin`."""
    groups = spec.state if len(shape) == 1 else spec.action
    low = torch.cat([g.stats["min"][..., :] for g in groups])
    high = torch.cat([g.stats["max"] for g in groups])
    u = torch.rand(*shape, low.numel()) * (1 + 2 * margin) - margin
    return low + u * (high - low)


def test_spec_from_dataset_meta(gr1, dataset_meta) -> None:
    stats = json.loads((dataset_meta / "stats.json").read_text())
    assert [g.name for g in gr1.state][:3] == ["left_arm", "left_hand", "left_leg"]
    assert gr1.state_dim == gr1.action_dim == 44 and gr1.slot == 20
    arm = gr1.action[0]
    assert torch.equal(arm.stats["max"], torch.tensor(stats["action"]["max"][0:7], dtype=torch.float32))
    spec = EmbodimentSpec.from_lerobot_meta(
        dataset_meta, "gr1", action_horizon=16, mean_std=["neck"], sin_cos=["waist"]
    )
    assert {g.name: g.mode for g in spec.state}["neck"] == "mean_std"
    assert spec.state_dim == 44 + 3 and spec.action_dim == 44  # sin_cos doubles the waist state only


def test_min_max_round_trip_and_clipping(gr1) -> None:
    state = _raw(gr1, 5)
    action = _raw(gr1, 5, 16)
    normalized = gr1.normalize_action(action, state)
    assert normalized.min() >= -1 and normalized.max() <= 1
    torch.testing.assert_close(gr1.unnormalize_action(normalized, state), action, atol=1e-4, rtol=1e-5)
    beyond = _raw(gr1, 5, 16, margin=0.5)
    clipped = gr1.normalize_action(beyond, state)
    assert clipped.abs().max() == 1.0
    low = torch.cat([g.stats["min"] for g in gr1.action])
    high = torch.cat([g.stats["max"] for g in gr1.action])
    torch.testing.assert_close(
        gr1.unnormalize_action(clipped, state), beyond.clamp(low, high), atol=1e-4, rtol=1e-5
    )


def test_mean_std_and_constant_joints() -> None:
    group = JointGroup(
        name="j", start=0, end=3, mode="mean_std", stats={"mean": [1, 2, 3], "std": [2, 0.5, 0]}
    )
    x = torch.tensor([[3.0, 2.5, 7.0]])
    assert torch.equal(group.normalize(x), torch.tensor([[1.0, 1.0, 0.0]]))
    torch.testing.assert_close(group.unnormalize(group.normalize(x))[:, :2], x[:, :2])
    flat = JointGroup(name="k", start=0, end=2, stats={"min": [0, 5], "max": [1, 5]})
    assert torch.equal(flat.normalize(torch.tensor([0.5, 9.0])), torch.tensor([0.0, 0.0]))
    with pytest.raises(ValueError, match="needs stats"):
        JointGroup(name="bad", start=0, end=2, mode="min_max", stats={"min": [0, 0]})
    with pytest.raises(ValueError, match="2 values, group has 3 dims"):
        JointGroup(name="bad", start=0, end=3, stats={"min": [0, 0], "max": [1, 1]})


def test_relative_actions_round_trip_through_the_processor(dataset_meta) -> None:
    plain = EmbodimentSpec.from_lerobot_meta(dataset_meta, "gr1", action_horizon=16)
    state, action = _raw(plain, 64), _raw(plain, 64, 16)
    relative = {"left_arm": "left_arm", "right_arm": "right_arm"}
    spec = EmbodimentSpec(
        tag="gr1",
        state=plain.state,
        action=[_with_relative(g, relative) for g in plain.action],
        action_horizon=16,
    )
    stats = relative_action_stats(spec, state, action)
    assert stats["left_arm"]["min"].shape == (16, 7)
    spec = EmbodimentSpec.from_lerobot_meta(
        dataset_meta, "gr1", action_horizon=16, relative=relative, relative_stats=stats
    )
    processor = GR00TProcessor(TINY, spec)
    out = processor(
        {"images": torch.zeros(64, 1, 3, 64, 64, dtype=torch.uint8), "state": state, "action": action},
        [TASK] * 64,
    )
    rel = action[..., 0:7] - state[:, None, 0:7]
    low, high = (torch.as_tensor(stats["left_arm"][k], dtype=torch.float32) for k in ("min", "max"))
    torch.testing.assert_close(
        out["action"][:, :16, 0:7], 2 * (rel - low) / (high - low) - 1, atol=1e-5, rtol=1e-5
    )
    decoded = processor.decode_action(out["action"], state)
    assert decoded.shape == (64, 16, 44)
    torch.testing.assert_close(decoded, action, atol=2e-4, rtol=1e-5)


def _with_relative(group: JointGroup, relative: dict[str, str]) -> JointGroup:
    if group.name not in relative:
        return group
    return JointGroup(
        name=group.name, start=group.start, end=group.end, mode="none", relative_to=relative[group.name]
    )


def test_processor_output_layout(gr1) -> None:
    processor = GR00TProcessor(TINY, gr1)
    state, action = _raw(gr1, 3)[:, None], _raw(gr1, 3, 10)
    images = torch.randint(0, 256, (3, 1, 64, 80, 3), dtype=torch.uint8)  # channel-last, any size
    out = processor({"images": images, "state": state, "action": action, "task": [TASK, "valid", TASK]})
    assert set(out) == {
        "input_ids",
        "attention_mask",
        "pixel_values",
        "state",
        "action",
        "action_mask",
        "embodiment_id",
    }
    assert out["pixel_values"].shape == (3, 1, 3, 56, 56) and out["pixel_values"].dtype == torch.float32
    assert out["state"].shape == (3, 1, 64) and torch.equal(out["state"][:, :, 44:], torch.zeros(3, 1, 20))
    assert out["action"].shape == out["action_mask"].shape == (3, 16, 64)
    assert out["action_mask"].sum() == 3 * 10 * 44 and out["action_mask"][:, :10, :44].all()
    assert torch.equal(out["action"] * (1 - out["action_mask"]), torch.zeros(3, 16, 64))
    assert torch.equal(out["embodiment_id"], torch.tensor([20, 20, 20]))
    ids, mask = out["input_ids"], out["attention_mask"]
    assert ids.dtype == torch.long and mask.dtype == torch.bool and ids.shape == mask.shape
    assert ((ids == TINY.image_token_id).sum(1) == 4).all()
    assert not mask[1, 0] and mask[0, 0] and mask[:, -1].all()  # "valid" is shorter: left padded
    assert (ids[~mask] == processor.pad_id).all()


def test_prompt_follows_the_chat_template(gr1) -> None:
    processor = GR00TProcessor(TINY, gr1, config=ProcessorConfig(num_images=2))
    run = "<IMG_CONTEXT>" * 4
    assert processor.prompt(TASK) == (
        "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n<|im_start|>user\n"
        "pick the pear from the counter and place it in the plate"
        f"<image 1><img>{run}</img><image 2><img>{run}</img><|im_end|>\n"
    )
    tokenizer = processor.tokenizer
    assert tokenizer.decode(processor.token_ids(TASK)) == processor.prompt(TASK)
    assert processor.token_ids(TASK) is processor.token_ids(TASK)  # cached
    raw = GR00TProcessor(TINY, gr1, config=ProcessorConfig(formalize_language=False))
    assert "place it in the plate!<image 1>" in raw.prompt(TASK)


def test_fixed_length_padding_for_graphs(gr1) -> None:
    config = ProcessorConfig(vlm_seq_len=80, padding_side="right")
    processor = GR00TProcessor(TINY, gr1, config=config)
    ids, mask = processor.tokenize([TASK, "valid"])
    assert ids.shape == (2, 80) and mask[:, 0].all() and not mask[:, -1].any()
    assert torch.equal(ids[0, : mask[0].sum()], torch.tensor(processor.token_ids(TASK)))
    assert processor.max_sequence_length([TASK, "valid"]) == len(processor.token_ids(TASK)) <= 80
    short = GR00TProcessor(TINY, gr1, config=ProcessorConfig(vlm_seq_len=10))
    with pytest.raises(ValueError, match=r"vlm_seq_len=10 is shorter than the prompt of task 'valid'"):
        short.tokenize(["valid"])


def test_image_inputs_passthrough_and_errors(gr1) -> None:
    frames = torch.randint(0, 256, (2, 1, 3, 56, 56), dtype=torch.uint8)
    state = _raw(gr1, 2)
    passthrough = GR00TProcessor(TINY, gr1, config=ProcessorConfig(image_mode="passthrough"))
    out = passthrough({"images": frames, "state": state}, ["a", "b"])
    assert out["images"] is frames and "pixel_values" not in out and "action" not in out
    ready = torch.rand(2, 1, 3, 56, 56) * 2 - 1
    torch_mode = GR00TProcessor(TINY, gr1)
    assert torch_mode({"pixel_values": ready, "state": state}, ["a", "b"])["pixel_values"] is ready
    assert torch_mode.image_spec == ImageSpec(size=(56, 56), mean=0.5, std=0.5, crop_fraction=0.95)
    with pytest.raises(ValueError, match=r"batch\['images'\] must be uint8 \[2, 1, 3, H, W\]"):
        torch_mode({"images": frames.float(), "state": state}, ["a", "b"])
    with pytest.raises(ValueError, match=r"batch\['pixel_values'\] must be float \[2, 1, 3, 56, 56\]"):
        torch_mode({"pixel_values": ready[:, :, :, :28], "state": state}, ["a", "b"])
    with pytest.raises(KeyError, match="images"):
        torch_mode({"state": state}, ["a", "b"])
    with pytest.raises(ValueError, match=r"batch\[.action.\] has 17 steps, embodiment .gr1. allows 16"):
        torch_mode({"pixel_values": ready, "state": state, "action": _raw(gr1, 2, 17)}, ["a", "b"])


def test_mixed_embodiments_in_one_batch(gr1) -> None:
    small = EmbodimentSpec(
        tag="new_embodiment",
        state=[JointGroup(name="arm", start=0, end=6, stats={"min": [-1] * 6, "max": [1] * 6})],
        action=[JointGroup(name="arm", start=0, end=6, stats={"min": [-2] * 6, "max": [2] * 6})],
        action_horizon=8,
    )
    processor = GR00TProcessor(TINY, [gr1, small])
    state = torch.zeros(2, 44)
    state[1, :6] = 0.5
    action = torch.zeros(2, 8, 44)
    out = processor(
        {
            "pixel_values": torch.zeros(2, 1, 3, 56, 56),
            "state": state,
            "action": action,
            "embodiment": ["gr1", "new_embodiment"],
        },
        ["a", "b"],
    )
    assert out["embodiment_id"].tolist() == [20, 10]
    assert out["action_mask"][0].sum() == 8 * 44 and out["action_mask"][1].sum() == 8 * 6
    assert (
        torch.allclose(out["state"][1, 0, :6], torch.full((6,), 0.5))
        and out["state"][1, 0, 6:].abs().sum() == 0
    )
    with pytest.raises(KeyError, match="embodiment"):
        processor({"pixel_values": torch.zeros(2, 1, 3, 56, 56), "state": state}, ["a", "b"])
    with pytest.raises(ValueError, match="exceed the model's"):
        GR00TProcessor(TINY.replace(max_state_dim=32), gr1)


def test_processed_batch_trains_and_decodes(gr1) -> None:
    processor = GR00TProcessor(TINY, gr1, config=ProcessorConfig(num_images=2, vlm_seq_len=96))
    model = GR00TN16(TINY)
    state, action = _raw(gr1, 2), _raw(gr1, 2, 16)
    frames = torch.randint(0, 256, (2, 2, 3, 64, 64), dtype=torch.uint8)
    batch = processor({"images": frames, "state": state, "action": action}, [TASK, "valid"])
    model.validate_batch(batch)
    loss = model(batch)["loss"]
    loss.backward()
    assert torch.isfinite(loss)
    decoded = processor.decode_action(model.get_action(batch), state)
    assert decoded.shape == (2, 16, 44) and torch.isfinite(decoded).all()


def test_preprocess_images_center_crop_resize_normalize() -> None:
    spec = ImageSpec(size=(28, 56), crop_fraction=0.5)
    frames = torch.zeros(1, 2, 3, 40, 80, dtype=torch.uint8)
    frames[..., 10:30, 20:60] = 255  # exactly the center half
    out = preprocess_images(frames, spec)
    assert out.shape == (1, 2, 3, 28, 56)
    torch.testing.assert_close(out, torch.ones_like(out))  # white -> (1 - 0.5) / 0.5
    channel_last = preprocess_images(frames.movedim(2, -1), spec)
    assert torch.equal(channel_last, out)
    gray = preprocess_images(torch.full((1, 1, 3, 40, 40), 51, dtype=torch.uint8), ImageSpec(size=(28, 28)))
    torch.testing.assert_close(gray, torch.full_like(gray, (51 / 255 - 0.5) / 0.5))


def test_image_spec_records_the_release_augmentation_ranges() -> None:
    """The release's config stores 0.1 for each color jitter range and keeps 0.95 of each side in its crop;
    a training pipeline takes them from here (gr00t-train hands them to vla-io)."""
    spec = ImageSpec(size=(56, 56))
    assert (spec.crop_fraction, spec.brightness, spec.contrast, spec.saturation, spec.hue) == (
        0.95,
        0.1,
        0.1,
        0.1,
        0.1,
    )


def test_bundled_tokenizer_is_reproducible(tmp_path) -> None:
    rebuilt = build_tiny_tokenizer(tmp_path / "tok.json")
    assert rebuilt.read_bytes() == TOKENIZER_FILE.read_bytes()
    tokenizer = load_tokenizer()
    assert (
        len(tokenizer) == TINY.vocab_size
        and tokenizer.convert_tokens_to_ids("<IMG_CONTEXT>") == TINY.image_token_id
    )
    text = "Unseen wörds ✓ 123"
    assert tokenizer.decode(tokenizer(text, add_special_tokens=False)["input_ids"]) == text


def test_tokenizer_must_match_the_model(gr1) -> None:
    with pytest.raises(ValueError, match="image_token_id"):
        GR00TProcessor(TINY.replace(image_token_id=5), gr1)
    with pytest.raises(FileNotFoundError, match="does not exist"):
        load_tokenizer("/nonexistent/tokenizer")


def test_any_local_hugging_face_tokenizer_directory(gr1, tmp_path) -> None:
    load_tokenizer().save_pretrained(tmp_path / "tok")
    from_dir = GR00TProcessor(TINY, gr1, tokenizer=tmp_path / "tok")
    bundled = GR00TProcessor(TINY, gr1)
    assert from_dir.token_ids(TASK) == bundled.token_ids(TASK)
    assert from_dir.pad_id == bundled.pad_id == 0
