"""Open-loop validation's data and numbers: which episodes are held out of training, the held-out samples a
run scores, and how predicted action chunks score against the recorded ones next to predicting the mean
action. The one owner of those numbers for the training loop (`validation/component.py`) and for
`gr00t-train infer` (`validation/infer.py`).

Scores are mean squared errors per action joint group and overall, over the real entries of the chunks
(steps past an episode's end and the padded action dims are left out, as the loss leaves them out), on the
normalized scale the model predicts (infer adds dataset units). The baseline predicts, for every step of every
chunk, the per-joint mean action of the run's normalization statistics (`mean` in stats.json: the dataset's
own statistics, or computed once from all of its rows, held-out episodes included), normalized as the targets
are: min/max groups map the mean into [-1, 1] as they map actions, mean/std groups give 0. `ratio` = model MSE
/ baseline MSE: below 1 the model predicts better than the mean.

A `data.mixture` run scores every member on its own held-out samples against its own baseline (its own
statistics); its overall MSE and baseline are the sample-weighted means of the members' (`mixture_scores`)."""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
import torch.distributed as dist

from .._errors import DataError
from .._rng import rng_state, set_rng_state

log = logging.getLogger(__name__)

Columns = list[tuple[str, int, int]]
"""(joint group, first column, width) of each action group in the normalized action vector."""


# --------------------------------------------------------------------------------------------- the split
@dataclass(frozen=True)
class EpisodeSplit:
    """A dataset's episodes (their episode_index) that train, and those held out for validation."""

    train: list[int]
    held_out: list[int]

    def facts(self) -> dict[str, Any]:
        """What summary.json and the checkpoint's dataset_meta/split.json record."""
        return {"held_out_episodes": self.held_out, "train_episodes": len(self.train)}


def held_out_count(setting: float, episodes: int) -> int:
    """How many of `episodes` `data.val_episodes` holds out: a whole number as given, a fraction in (0, 1)
    of the episodes rounded down."""
    if setting >= 1:
        return int(setting)
    return math.floor(setting * episodes + 1e-9)  # 0.29 * 100 is 28.999...: 29 meant


def split_episodes(episodes: Sequence[int], setting: float) -> EpisodeSplit:
    """Hold out `data.val_episodes` of `episodes`, spread evenly over their sorted order: the middle episode
    of each of n equal runs, so the same dataset always gives the same split. DataError when nothing would
    be left to train on."""
    ordered = sorted({int(e) for e in episodes})
    total, n = len(ordered), held_out_count(setting, len(ordered))
    if n >= total and n > 0:
        raise DataError(
            f"data.val_episodes={setting:g} holds out {n} of the dataset's {total} episode(s), leaving none to "
            "train on: hold out fewer (e.g. --set data.val_episodes=1) or none (--set data.val_episodes=0)"
        )
    # total / n >= 1, so the n picks are distinct
    held = [ordered[int((i + 0.5) * total / n)] for i in range(n)]
    chosen = set(held)
    return EpisodeSplit([e for e in ordered if e not in chosen], held)


def describe_split(split: EpisodeSplit, setting: float, validates: bool) -> str:
    """The one start-up line about the split."""
    total = len(split.train) + len(split.held_out)
    if not split.held_out:
        if setting == 0:
            return "data.val_episodes=0: every episode trains, no validation runs"
        return (
            f"data.val_episodes={setting:g} of {total} episodes rounds down to 0: every episode trains and no "
            "validation runs (ask for it with a whole number of episodes, e.g. --set data.val_episodes=1)"
        )
    when = "validated every eval.every steps" if validates else "not validated: eval.every=0"
    return (
        f"holding out {len(split.held_out)} of {total} episodes for validation (data.val_episodes="
        f"{setting:g}; {when}): episodes {split.held_out}"
    )


# ---------------------------------------------------------------------------------------------- scoring
def action_columns(spec) -> Columns:
    """(group, first column, width) of each action group of a gr00t_model EmbodimentSpec, in the normalized
    action vector the model predicts (the groups concatenated in order)."""
    columns, offset = [], 0
    for group in spec.action:
        columns.append((group.name, offset, group.out_dim))
        offset += group.out_dim
    return columns


def mean_action(spec, horizon: int) -> torch.Tensor:
    """[horizon, action_dim]: the mean-action baseline on the normalized scale, normalized by each group's
    own rule (min/max: mapped like an action; mean/std: 0; a per-step relative group: its per-step mean). A
    group whose statistics hold no mean gets NaN (its baseline and ratio are then NaN)."""
    parts = []
    for group in spec.action:
        mean = group.stats.get("mean")
        if mean is None:
            parts.append(torch.full((horizon, group.out_dim), float("nan")))
            continue
        mean = torch.as_tensor(mean, dtype=torch.float32)
        mean = mean[:horizon] if mean.ndim == 2 else mean.expand(horizon, group.dim)
        parts.append(group.normalize(mean))
    return torch.cat(parts, dim=-1)


class ActionErrors:
    """Sums of squared errors per action group, of predicted chunks and of the baseline, against the recorded
    ones, over the real entries only; `scores()` turns them into MSEs and ratios."""

    def __init__(self, columns: Columns, device: torch.device | str | None = None) -> None:
        self.columns = columns
        self.sums = torch.zeros(len(columns), 3, dtype=torch.float64, device=device)
        """Per group: model, baseline, real entries."""
        self.samples = 0

    def add(
        self, predicted: torch.Tensor, target: torch.Tensor, baseline: torch.Tensor, real: torch.Tensor
    ) -> None:
        """predicted, target: [B, >=T, >=D]; baseline: [T, D] or [B, T, D] (the same scale); real: [B, T]
        (steps) or [B, T, >=D] (entries, e.g. an action_mask) marking what counts. Steps past the baseline's T
        are left out (they are padding)."""
        steps = min(real.shape[1], baseline.shape[-2])
        real = real[:, :steps].bool()
        for i, (_, start, width) in enumerate(self.columns):
            cols = slice(start, start + width)
            mask = real[..., cols] if real.ndim == 3 else real[..., None].expand(-1, -1, width)
            truth = target[:, :steps, cols].float()
            for j, guess in enumerate((predicted[:, :steps, cols], baseline[..., :steps, cols])):
                squared = (guess.float() - truth) ** 2
                self.sums[i, j] += torch.where(mask, squared, 0.0).sum(dtype=torch.float64)
            self.sums[i, 2] += mask.sum()
        self.samples += int(real.shape[0])

    def all_reduce(self) -> None:
        """Sum over ranks (a collective: every rank calls it)."""
        if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
            flat = torch.cat([self.sums.flatten(), self.sums.new_tensor([float(self.samples)])])
            dist.all_reduce(flat)
            self.sums, self.samples = flat[:-1].view_as(self.sums), int(flat[-1].item())

    def scores(self) -> dict[str, Any]:
        """{"mse", "baseline", "ratio", "samples", "groups": {group: {"mse", "baseline", "ratio"}}}."""
        rows = self.sums.cpu().tolist()
        groups = {name: _score(*row) for (name, _, _), row in zip(self.columns, rows)}
        total = [sum(column) for column in zip(*rows)] if rows else [0.0, 0.0, 0.0]
        return {**_score(*total), "samples": self.samples, "groups": groups}


def _score(model: float, baseline: float, entries: float) -> dict[str, float]:
    mse = model / entries if entries else math.nan
    base = baseline / entries if entries else math.nan
    return {"mse": mse, "baseline": base, "ratio": mse / base if base > 0 else math.nan}


def mixture_scores(members: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """A mixture's record from its members' `ActionErrors.scores()`: overall MSE and baseline are the members'
    weighted by their samples (so `ratio` reads as a single dataset's), `groups` stays per member (members'
    joint groups are their embodiments' own), `members` holds each member's scores."""
    samples = sum(s["samples"] for s in members.values())
    counted = [s for s in members.values() if s["samples"]]
    mse = sum(s["samples"] * s["mse"] for s in counted) / samples if samples else math.nan
    base = sum(s["samples"] * s["baseline"] for s in counted) / samples if samples else math.nan
    overall = {"mse": mse, "baseline": base, "ratio": mse / base if base > 0 else math.nan}
    return {**overall, "samples": samples, "groups": {}, "members": members}


def score_line(scores: dict[str, Any]) -> str:
    """`MSE 0.0123 vs 0.0456 predicting the mean (ratio 0.27)`: overall, normalized scale."""
    return (
        f"MSE {scores['mse']:.4g} vs {scores['baseline']:.4g} predicting the mean "
        f"(ratio {scores['ratio']:.3g}; normalized scale)"
    )


# ---------------------------------------------------------------------------------- the held-out samples
@dataclass
class HeldOut:
    """A run's held-out samples, prepared once, and how its model predicts them (TrainParts.validation)."""

    batches: list[dict[str, Any]]
    """This rank's share of the batches: model inputs on the host, with `action` (normalized, padded) and
    `action_mask` (1 on the real entries) as the loss sees them."""
    ids: list[int]
    """Each batch's place in the whole set: it seeds the batch's noise, the same at any world size."""
    columns: Columns
    baseline: torch.Tensor
    """[T, D]: the mean-action baseline on the normalized scale (`mean_action`)."""
    predict: Callable[[torch.nn.Module, dict[str, Any], torch.Tensor], torch.Tensor]
    """(model, batch on the device, noise) -> normalized action chunks [B, >=T, >=D], without gradients."""
    noise_shape: tuple[int, ...]
    """One sample's noise."""
    seed: int
    episodes: list[int]
    """The held-out episodes (episode_index)."""
    name: str = ""
    """A mixture member's label (its scores are recorded under it); "" for a single dataset."""

    def noise(self, batch_id: int, size: int, device: torch.device) -> torch.Tensor:
        """The batch's noise: from its own generator, the same at every validation and on any device."""
        seed = int(np.random.SeedSequence([self.seed, 0x5EED, batch_id]).generate_state(1)[0])
        generator = torch.Generator().manual_seed(seed)
        return torch.randn((size, *self.noise_shape), generator=generator).to(device)


@contextmanager
def isolated_rng(device: torch.device | None = None) -> Iterator[None]:
    """Every random stream (python, numpy, torch CPU and `device`'s) as it was before the block."""
    state = rng_state(device)
    try:
        yield
    finally:
        set_rng_state(state, device)


def choose_frames(available: int, wanted: int, seed: int) -> list[int]:
    """A fixed, seeded choice of `wanted` of `available` samples (all of them when there are fewer), sorted."""
    if wanted >= available:
        return list(range(available))
    rng = np.random.default_rng([seed, 0x7A1])
    return sorted(int(i) for i in rng.choice(available, size=wanted, replace=False))


def load_held_out(cfg, env, data, processor, model, name: str = "") -> HeldOut | None:
    """The held-out samples of a GR00T run (`data.split`), decoded once and prepared as training prepares a
    batch (the processor, then the image transform with a centre crop and no jitter), this rank's share of
    `eval.batches` batches; None without held-out episodes or with eval.every=0. A mixture member (`name`,
    `cfg` its single-dataset view) gets the samples and noise its own single-dataset run would."""
    import vla_io

    from ..data.dataset import KEEP_KEYS, host_transform, image_transform

    split = data.split
    if split is None or not split.held_out or cfg.eval.every == 0:
        return None
    started = time.perf_counter()
    fps = float(data.dataset.meta.fps)
    reader = vla_io.LeRobotDataset(
        data.root,
        episodes=split.held_out,
        delta_timestamps={
            key: [i / fps for i in range(data.horizon)] for key in data.features.features("action")
        },
        video_keys=data.camera_keys,
        image_dtype="uint8",
        progress=False,
    )
    size = cfg.data.batch_size
    chosen = choose_frames(len(reader), cfg.eval.batches * size, cfg.seed)
    chunks = [chosen[i : i + size] for i in range(0, len(chosen), size)]
    mine = list(range(env.rank, len(chunks), env.world_size))  # every rank scores its share; sums all-reduced
    to_model = host_transform(data, processor)
    images = image_transform(processor, len(data.camera_keys), augment=False, backend="torch")
    with isolated_rng():  # decoding and transforms draw nothing from the run's streams
        batches = [images(to_model(reader.get_batch(chunks[i]))) for i in mine]
    batches = [{k: v for k, v in b.items() if k in KEEP_KEYS} for b in batches]
    log.info(
        "validation set%s: %d samples of the held-out episodes in %d batch(es), prepared in %.1f s",
        f" of {name}" if name else "", len(chosen), len(chunks), time.perf_counter() - started,
    )  # fmt: skip
    c = model.config
    return HeldOut(
        batches=batches,
        ids=mine,
        columns=action_columns(data.spec),
        baseline=mean_action(data.spec, data.horizon),
        predict=predict_actions,
        noise_shape=(c.action_horizon, c.max_action_dim),
        seed=cfg.seed,
        episodes=list(split.held_out),
        name=name,
    )


def predict_actions(model, batch: dict[str, Any], noise: torch.Tensor) -> torch.Tensor:
    """A GR00T model's normalized action chunks from the given noise (gr00t_model's get_action)."""
    return model.get_action(batch, noise=noise)
