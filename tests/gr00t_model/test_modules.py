"""Each building block against a plain reference: transformers' own SigLIP2 / Qwen3 models, and the spec's formulas."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from _transformers_reference import qwen3_config, siglip2_config
from gr00t_model._action_head import CategorySpecificLinear, bucket_sinusoid
from gr00t_model._dit import AlternateVLDiT, timestep_sinusoid
from gr00t_model._language import (
    LanguageModel,
    causal_padding_mask,
    init_language_,
    rotary_tables,
)
from gr00t_model._vision import VisionTower, connect, init_vision_, patchify
from torch import nn


def test_patchify_matches_transformers_patch_order() -> None:
    try:  # numpy reference (transformers >= 5.2x moved it to the PIL processor module)
        from transformers.models.siglip2.image_processing_pil_siglip2 import convert_image_to_patches
    except ImportError:
        from transformers.models.siglip2.image_processing_siglip2 import convert_image_to_patches

    images = torch.randn(3, 3, 42, 28)
    ours = patchify(images, 14)
    for i in range(3):
        assert torch.equal(ours[i], torch.from_numpy(convert_image_to_patches(images[i].numpy(), 14)))


@pytest.mark.parametrize("size", [(56, 56), (84, 112)])  # 4x4 grid as stored, and resized to 6x8
def test_vision_tower_matches_transformers_siglip2(fp32_tiny, size) -> None:
    from transformers import Siglip2VisionModel

    config = fp32_tiny(image_size=size)
    ours = VisionTower(config).eval()
    init_vision_(ours)
    reference = Siglip2VisionModel(siglip2_config(config)).eval()
    prefix = "vision_model." if hasattr(reference, "vision_model") else ""  # older transformers nest it
    missing, unexpected = reference.load_state_dict(
        {prefix + k: v for k, v in ours.state_dict().items()}, strict=False
    )
    assert not missing and not unexpected
    images = torch.randn(3, 3, *size)
    rows, cols = size[0] // 14, size[1] // 14
    with torch.no_grad():
        expected = reference(
            pixel_values=patchify(images, 14),
            pixel_attention_mask=torch.ones(3, rows * cols, dtype=torch.long),
            spatial_shapes=torch.tensor([[rows, cols]] * 3),
        ).last_hidden_state
        got = ours(images)
    assert got.shape == (3, rows, cols, config.vision_hidden_size)
    torch.testing.assert_close(got.reshape(3, rows * cols, -1), expected, atol=2e-5, rtol=1e-5)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_vision_layers_leave_their_last_residual_add_to_the_next_with_the_same_arithmetic(
    fp32_tiny, dtype
) -> None:
    from transformers.models.siglip2.modeling_siglip2 import Siglip2EncoderLayer

    config = fp32_tiny()
    tower = VisionTower(config).eval().to(dtype)
    init_vision_(tower)
    plain = [Siglip2EncoderLayer(siglip2_config(config)).eval().to(dtype) for _ in tower.encoder.layers]
    for reference, layer in zip(plain, tower.encoder.layers, strict=True):
        reference.load_state_dict(layer.state_dict())
    assert len(plain) > 1
    hidden = torch.randn(2, 16, config.vision_hidden_size, dtype=dtype)
    with torch.no_grad():
        expected = hidden
        for reference in plain:
            out = reference(expected, attention_mask=None)
            expected = out[0] if isinstance(out, tuple) else out
        got, pending = hidden, None
        for layer in tower.encoder.layers:
            got, pending = layer(got, pending)
    assert torch.equal(got + pending, expected)  # the same adds in the same order: bitwise


def test_layers_have_transformers_parameters_in_its_order_and_draw_the_same_initial_weights(
    fp32_tiny,
) -> None:
    """Release weights load by name, and a seeded random model is the one transformers' layers would give."""
    from gr00t_model._language import LanguageLayer, RMSNorm
    from gr00t_model._vision import VisionLayer
    from transformers.models.qwen3.modeling_qwen3 import Qwen3DecoderLayer, Qwen3RMSNorm
    from transformers.models.siglip2.modeling_siglip2 import Siglip2EncoderLayer

    config = fp32_tiny()
    pairs = [
        (lambda: VisionLayer(config), lambda: Siglip2EncoderLayer(siglip2_config(config))),
        (lambda: LanguageLayer(config), lambda: Qwen3DecoderLayer(qwen3_config(config), 0)),
        (lambda: RMSNorm(64, 1e-6), lambda: Qwen3RMSNorm(64, eps=1e-6)),
    ]
    state = torch.random.get_rng_state()
    try:
        for ours, theirs in pairs:
            torch.manual_seed(7)
            a = ours().state_dict()
            torch.manual_seed(7)
            b = theirs().state_dict()
            assert list(a) == list(b)
            assert all(torch.equal(a[k], b[k]) for k in a)
    finally:
        torch.random.set_rng_state(state)


def test_rms_norm_computes_qwen3s_in_bf16_bitwise() -> None:
    from gr00t_model._language import RMSNorm
    from transformers.models.qwen3.modeling_qwen3 import Qwen3RMSNorm

    ours, theirs = RMSNorm(64, 1e-6), Qwen3RMSNorm(64, eps=1e-6)
    with torch.no_grad():
        ours.weight.uniform_(0.5, 1.5)
        theirs.weight.copy_(ours.weight)
    x = torch.randn(3, 5, 64, generator=torch.Generator().manual_seed(0)).to(torch.bfloat16)
    with torch.no_grad():
        assert torch.equal(ours.to(torch.bfloat16)(x), theirs.to(torch.bfloat16)(x))


def test_a_model_with_its_own_layer_classes_pickles_whole(fp32_tiny) -> None:
    import io

    from gr00t_model import GR00TN16

    model = GR00TN16(fp32_tiny())
    buffer = io.BytesIO()
    torch.save(model, buffer)  # the layer class is made on first use; pickle must find it by name
    buffer.seek(0)
    loaded = torch.load(buffer, weights_only=False)
    layer = loaded.backbone.vision_model.encoder.layers[0]
    assert type(layer) is type(model.backbone.vision_model.encoder.layers[0])
    assert type(loaded.backbone.language_model.layers[0]) is type(model.backbone.language_model.layers[0])
    assert all(torch.equal(a, b) for a, b in zip(loaded.state_dict().values(), model.state_dict().values()))


def test_images_attend_only_within_themselves(fp32_tiny) -> None:
    tower = VisionTower(fp32_tiny()).eval()
    images = torch.randn(2, 3, 56, 56)
    changed = images.clone()
    changed[1] = torch.randn(3, 56, 56)
    with torch.no_grad():
        a, b = tower(images), tower(changed)
        alone = tower(images[:1])
    assert torch.equal(a[0], b[0]) and not torch.allclose(a[1], b[1])
    torch.testing.assert_close(alone[0], a[0], atol=1e-6, rtol=1e-6)


def test_connector_unshuffles_2x2_neighbourhoods_in_raster_order() -> None:
    features = torch.randn(2, 4, 6, 5)  # [N, h, w, C]
    tokens = connect(nn.Identity(), features, 2)
    assert tokens.shape == (2, 2 * 3, 4 * 5)
    for i in range(2):
        for j in range(3):
            expected = torch.stack(
                [features[:, 2 * i + di, 2 * j + dj] for di in (0, 1) for dj in (0, 1)], dim=-1
            )
            assert torch.equal(
                tokens[:, i * 3 + j], expected.reshape(2, -1)
            )  # channel-major: c * 4 + di * 2 + dj


def test_language_model_matches_transformers_qwen3_with_left_padding(fp32_tiny) -> None:
    from transformers import Qwen3Model

    config = fp32_tiny()
    ours = LanguageModel(config).eval()
    init_language_(ours)
    reference = Qwen3Model(qwen3_config(config)).eval()
    missing, unexpected = reference.load_state_dict(ours.state_dict(), strict=False)
    assert not unexpected and all("rotary" in k for k in missing)
    embeds = torch.randn(2, 9, config.llm_hidden_size)
    valid = torch.ones(2, 9, dtype=torch.bool)
    valid[1, :3] = False  # left padding
    with torch.no_grad():
        got = ours(embeds, valid)
        expected = reference(inputs_embeds=embeds, attention_mask=valid.long()).last_hidden_state
    torch.testing.assert_close(got[valid], expected[valid], atol=2e-5, rtol=1e-5)
    assert torch.isfinite(got).all()


def _plain_qwen3_layers(ours: LanguageModel, config, dtype) -> list[nn.Module]:
    from transformers.models.qwen3.modeling_qwen3 import Qwen3DecoderLayer

    plain = [Qwen3DecoderLayer(qwen3_config(config), i).eval().to(dtype) for i in range(len(ours.layers))]
    for reference, layer in zip(plain, ours.layers, strict=True):
        reference.load_state_dict(layer.state_dict())
    return plain


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_language_layers_compute_transformers_qwen3_layers_and_leave_their_last_add_to_the_next(
    fp32_tiny, dtype
) -> None:
    config = fp32_tiny(llm_num_layers=3)
    assert config.llm_num_heads > config.llm_num_kv_heads  # grouped queries: k and v are repeated
    ours = LanguageModel(config).eval().to(dtype)
    init_language_(ours)
    plain = _plain_qwen3_layers(ours, config, dtype)
    hidden = torch.randn(2, 9, config.llm_hidden_size, dtype=dtype)
    valid = torch.ones(2, 9, dtype=torch.bool)
    valid[1, :3] = False
    cos, sin = rotary_tables(9, config.llm_head_dim, config.llm_rope_theta, "cpu", dtype)
    mask = causal_padding_mask(valid)
    with torch.no_grad():
        expected = hidden
        for reference in plain:
            out = reference(expected, attention_mask=mask, position_embeddings=(cos, sin))
            expected = out[0] if isinstance(out, tuple) else out
        got = ours.run_layers(hidden, valid, 0, 3)
    assert torch.equal(got, expected)  # the same ops in the same order: bitwise


def test_language_model_output_does_not_depend_on_padding_side_or_amount(fp32_tiny) -> None:
    ours = LanguageModel(fp32_tiny()).eval()
    init_language_(ours)
    real = torch.randn(1, 6, 64)
    left = torch.cat([torch.randn(1, 4, 64), real], dim=1)
    right = torch.cat([real, torch.randn(1, 2, 64)], dim=1)
    with torch.no_grad():
        alone = ours(real, torch.ones(1, 6, dtype=torch.bool))
        from_left = ours(left, torch.tensor([[False] * 4 + [True] * 6]))[:, 4:]
        from_right = ours(right, torch.tensor([[True] * 6 + [False] * 2]))[:, :6]
    torch.testing.assert_close(from_left, alone, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(from_right, alone, atol=1e-6, rtol=1e-6)


def test_timestep_sinusoid_is_the_diffusers_formula() -> None:
    buckets = torch.tensor([0, 250, 999])
    got = timestep_sinusoid(buckets, 256)
    half = 128
    freqs = [math.exp(-math.log(10000) * i / (half - 1)) for i in range(half)]
    for row, b in enumerate(buckets.tolist()):
        expected = [math.cos(b * f) for f in freqs] + [math.sin(b * f) for f in freqs]
        torch.testing.assert_close(got[row], torch.tensor(expected), atol=2e-4, rtol=0)


def test_action_encoder_sinusoid_sines_then_cosines() -> None:
    got = bucket_sinusoid(torch.tensor([7, 500]), 3, 8)
    assert got.shape == (2, 3, 8)
    freqs = [math.exp(-i * math.log(10000) / 4) for i in range(4)]
    expected = torch.tensor(
        [[math.sin(b * f) for f in freqs] + [math.cos(b * f) for f in freqs] for b in (7, 500)]
    )
    torch.testing.assert_close(got[:, 1], expected, atol=2e-4, rtol=0)
    assert torch.equal(got[:, 0], got[:, 2])


def test_category_specific_linear_picks_each_rows_slot() -> None:
    layer = CategorySpecificLinear(5, 3, 4)
    nn.init.normal_(layer.b)
    x, slots = torch.randn(3, 2, 3), torch.tensor([4, 0, 4])
    got = layer(x, slots)
    for i, s in enumerate(slots.tolist()):
        torch.testing.assert_close(got[i], x[i] @ layer.W[s] + layer.b[s])


def _reference_dit(
    dit: AlternateVLDiT, tokens, context, buckets, text_mask, image_mask, period: int, keeps=None, p=0.0
):
    """The spec's DiT, written out with explicit softmax attention and -inf masks; with `keeps` (each block's
    keep-masks, [blocks, 3 + ff_mult token sizes]) dropout at the release's four places, scaled by 1/(1-p)."""

    def attend(attn, x, source, mask):
        q, k, v = attn.to_q(x), attn.to_k(source), attn.to_v(source)
        heads = attn.heads

        def split(t):
            return t.reshape(t.shape[0], t.shape[1], heads, -1).transpose(1, 2)

        scores = split(q) @ split(k).transpose(-1, -2) / math.sqrt(q.shape[-1] // heads)
        if mask is not None:
            scores = scores.masked_fill(~mask[:, None, None, :], float("-inf"))
        out = (scores.softmax(-1) @ split(v)).transpose(1, 2).reshape(x.shape)
        return attn.to_out[0](out)

    def norm(x, eps):
        return F.layer_norm(x, x.shape[-1:], eps=eps)

    def drop(x, keep):
        return x if keep is None else x * keep.view(x.shape) / (1 - p)

    temb = dit.timestep_encoder(buckets)
    x = tokens
    for i, block in enumerate(dit.transformer_blocks):
        n = (
            x.numel()
        )  # each block's row: attention output, final_dropout, feed-forward inner and output masks
        masks = [None] * 4 if keeps is None else keeps[i].split([n, n, keeps.shape[1] - 3 * n, n])
        scale, shift = block.norm1.linear(F.silu(temb)).chunk(2, dim=1)
        h = norm(x, 1e-5) * (1 + scale[:, None]) + shift[:, None]
        if i % 2:
            a = attend(block.attn1, h, h, None)
        else:
            a = attend(block.attn1, h, context, text_mask if i % period == 0 else image_mask)
        x = x + drop(drop(a, masks[0]), masks[1])
        ff = block.ff.net
        u = drop(F.gelu(ff[0].proj(norm(x, 1e-5)), approximate="tanh"), masks[2])
        x = x + drop(ff[2](u), masks[3])
    shift, scale = dit.proj_out_1(F.silu(temb)).chunk(2, dim=1)
    return dit.proj_out_2(norm(x, 1e-6) * (1 + scale[:, None]) + shift[:, None])


def test_dit_matches_the_plain_reference_with_its_masks(fp32_tiny) -> None:
    config = fp32_tiny(dit_num_layers=8)
    dit = AlternateVLDiT(config).eval()
    tokens, context = torch.randn(2, 5, 64), torch.randn(2, 7, 64)
    image = torch.tensor([[0, 1, 1, 0, 0, 1, 0], [0, 0, 1, 1, 1, 0, 0]], dtype=torch.bool)
    valid = torch.tensor([[1, 1, 1, 1, 1, 1, 0], [0, 1, 1, 1, 1, 1, 1]], dtype=torch.bool)
    buckets = torch.tensor([3, 998])
    with torch.no_grad():
        got = dit(tokens, context, buckets, ~image & valid, image & valid)
        expected = _reference_dit(dit, tokens, context, buckets, ~image & valid, image & valid, 4)
    torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-5)


def test_dit_dropout_applies_its_drawn_masks_where_the_release_drops(fp32_tiny) -> None:
    config = fp32_tiny(dit_num_layers=4)
    dit = AlternateVLDiT(config).train()
    tokens, context = torch.randn(2, 5, 64), torch.randn(2, 7, 64)
    text = torch.tensor([[1, 1, 1, 0, 0, 0, 0], [1, 1, 0, 0, 0, 0, 0]], dtype=torch.bool)
    buckets = torch.tensor([3, 998])
    with torch.no_grad(), torch.random.fork_rng():
        torch.manual_seed(11)
        got = dit(tokens, context, buckets, text, ~text)
        torch.manual_seed(11)  # the same single draw the forward made first
        keeps = dit.keep_masks(tokens)
        expected = _reference_dit(dit, tokens, context, buckets, text, ~text, 4, keeps, config.dit_dropout)
    assert keeps.shape == (4, (3 + config.dit_ff_mult) * tokens.numel()) and keeps.dtype == torch.bool
    # The same ops as the module on the same values, except the attention (softmax written out).
    torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-5)
    assert not torch.allclose(got, dit.eval()(tokens, context, buckets, text, ~text), atol=1e-3)


def test_dit_keep_masks_keep_one_minus_p_and_none_without_dropout(fp32_tiny) -> None:
    dit = AlternateVLDiT(fp32_tiny(dit_num_layers=2, dit_dropout=0.2)).train()
    tokens = torch.empty(16, 51, 64)
    with torch.random.fork_rng():
        keeps = dit.keep_masks(tokens)
    n = keeps.numel()
    # Bernoulli(0.8) over n draws: the kept fraction is within 6 standard deviations of 0.8.
    assert abs(keeps.float().mean().item() - 0.8) < 6 * math.sqrt(0.8 * 0.2 / n)
    assert dit.eval().keep_masks(tokens) is None
    assert AlternateVLDiT(fp32_tiny(dit_num_layers=2, dit_dropout=0.0)).train().keep_masks(tokens) is None


def test_dit_block_kinds_and_what_each_cross_block_sees(fp32_tiny) -> None:
    config = fp32_tiny(dit_num_layers=2)  # block 0 attends to text only, block 1 is self-attention
    dit = AlternateVLDiT(config).eval()
    assert dit.transformer_blocks[0].attn1.to_k.in_features == config.llm_hidden_size
    assert dit.transformer_blocks[1].attn1.to_k.in_features == config.input_embedding_dim
    tokens, context = torch.randn(1, 4, 64), torch.randn(1, 6, 64)
    image = torch.tensor([[0, 0, 1, 1, 0, 0]], dtype=torch.bool)
    valid = torch.tensor([[1, 1, 1, 1, 1, 0]], dtype=torch.bool)
    perturbed = context.clone()
    perturbed[0, 2:4] += 5.0  # image tokens
    perturbed[0, 5] += 5.0  # a padding token
    args = (torch.tensor([10]), ~image & valid, image & valid)
    with torch.no_grad():
        assert torch.equal(dit(tokens, context, *args), dit(tokens, perturbed, *args))
        perturbed[0, 0] += 5.0  # a text token
        assert not torch.allclose(dit(tokens, context, *args), dit(tokens, perturbed, *args))


def test_dit_cached_keys_values_give_the_same_result(fp32_tiny) -> None:
    dit = AlternateVLDiT(fp32_tiny()).eval()
    tokens, context = torch.randn(2, 5, 64), torch.randn(2, 7, 64)
    masks = (torch.rand(2, 7) > 0.3, torch.rand(2, 7) > 0.3)
    with torch.no_grad():
        plain = dit(tokens, context, torch.tensor([0, 250]), *masks)
        cached = dit(tokens, context, torch.tensor([0, 250]), *masks, kv_cache=dit.cross_key_values(context))
    assert torch.equal(plain, cached)


def test_dit_row_with_nothing_to_attend_to_stays_finite(fp32_tiny) -> None:
    dit = AlternateVLDiT(fp32_tiny()).eval()
    nothing = torch.zeros(1, 7, dtype=torch.bool)
    with torch.no_grad():
        out = dit(torch.randn(1, 5, 64), torch.randn(1, 7, 64), torch.tensor([5]), nothing, nothing)
    assert torch.isfinite(out).all()
