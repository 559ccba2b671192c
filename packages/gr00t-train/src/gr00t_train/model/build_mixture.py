"""TrainParts of a `data.mixture` run: `model.build.build_parts`'s steps with every member opened as its own
dataset (`data.mixture_data`), one processor per member, and one pipeline over the mixture."""

from __future__ import annotations

import logging

from .._distributed import DistEnv
from .._parts import TrainParts
from ..config.sections import TrainConfig
from ..data import mixture_data as _mixture_data
from ..data.component import build_source
from ..data.mixture import member_config
from ..validation import held_out as _validation
from . import gr00t as _gr00t
from .build import build_model_parts, model_parts, startup_facts

log = logging.getLogger(__name__)


def build_mixture_parts(cfg: TrainConfig, env: DistEnv) -> TrainParts:
    """Members' metadata, features and splits (before the model) -> the model -> the members opened, their
    processors and the mixture pipeline; validation scores each member's held-out episodes (one HeldOut per
    member that holds some out, as its single-dataset run would prepare them)."""
    plans = _mixture_data.plan_mixture(cfg)  # metadata only: a member that cannot be used stops here
    facts, tokenizer, model = build_model_parts(cfg, env)  # start-up's model phase ends here
    mix = _mixture_data.open_mixture(plans, model_horizon=model.config.action_horizon, progress=env.is_main)
    processors = _mixture_data.attach_processors(mix, model.config, tokenizer, cfg.model.vlm_seq_len)
    first, cameras = mix.members[0], len(mix.members[0].camera_keys)
    vlm_tokens = processors[0].config.vlm_seq_len
    flops, tokens = _gr00t.flops_and_tokens(model.config, cameras, vlm_tokens)
    source = build_source(
        cfg, env, first, processors[0], check_first=model.validate_batch,
        dataset=mix.dataset, transform=_mixture_data.host_rows,
        wrap_images=lambda augment: _mixture_data.MixtureImages(augment, mix),
    )  # fmt: skip
    for entry, member, weight, sizes in zip(mix.entries, mix.members, mix.dataset.weights, mix.frame_sizes):
        log.info(
            "mixture member %s: %s, weight %.3f, %d samples, embodiment %s, cameras %s %s, state %s, action %s",
            entry.label, member.root, weight, len(member.dataset), entry.embodiment_tag, member.camera_keys,
            sizes, list(member.features.modality["state"]), list(member.features.modality["action"]),
        )  # fmt: skip
    log.info(
        "model %s, %d camera slot(s)%s, %d VLM tokens, action chunk %d; %d samples per epoch from %d datasets",
        cfg.model.preset, cameras, "" if mix.uniform_frames else f" (padded to {mix.canvases})", vlm_tokens,
        first.horizon, len(mix.dataset), len(mix.members),
    )  # fmt: skip
    save = lambda module, folder: _mixture_data.save_mixture_meta(module, folder, mix)  # noqa: E731
    parts = model_parts(cfg, env, model, source, save, flops, tokens)
    held = [
        _validation.load_held_out(member_config(cfg, i), env, member, processor, model, name=entry.label)
        for i, (entry, member, processor) in enumerate(zip(mix.entries, mix.members, processors))
    ]
    parts.validation = [h for h in held if h is not None] or None
    parts.base = _gr00t.base_weights(model)
    parts.facts = {
        **facts,
        **startup_facts(),
        "validation_split": {e.label: m.split.facts() for e, m in zip(mix.entries, mix.members) if m.split},
        "mixture": [
            {"name": e.label, "dataset": str(m.root), "weight": float(w), "samples": len(m.dataset)}
            for e, m, w in zip(mix.entries, mix.members, mix.dataset.weights)
        ],
    }
    return parts
