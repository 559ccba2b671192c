"""The data side of a run, from vla_io and gr00t_model: the LeRobot dataset and its statistics, the GR00T
processor as the pipeline's host-thread transform, per-camera image work on the device, and the Pipeline as
an endless, resumable BatchSource. Errors about the dataset are re-raised as DataError with the field to
change."""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import gr00t_model
import numpy as np
import torch

from .._errors import ConfigError, DataError
from ..config.sections import TrainConfig
from ..validation.held_out import EpisodeSplit, describe_split, split_episodes
from .features import FeatureMap, map_features

log = logging.getLogger(__name__)

KEEP_KEYS = (
    "input_ids",
    "attention_mask",
    "pixel_values",
    "state",
    "action",
    "action_mask",
    "embodiment_id",
    "episode_index",
    "frame_index",
)
"""What the training step receives of a pipeline batch (tensors only: graphs need fixed inputs)."""
CAMERA_SLOTS = tuple(f"camera{i}" for i in range(16))
"""Batch keys the cameras travel under from the host step to the device step."""


@dataclass
class TrainingData:
    """A dataset opened for one model: which cameras, how to normalize, how long the action chunks are."""

    root: Path
    dataset: Any
    spec: gr00t_model.EmbodimentSpec
    camera_keys: list[str]
    horizon: int
    features: FeatureMap
    stats: dict[str, dict[str, Any]]
    """The statistics the spec normalizes with, per feature (what a checkpoint records)."""
    split: EpisodeSplit | None = None
    """Training and held-out episodes (data.val_episodes); None: every episode of `dataset` (infer)."""

    @property
    def train_episodes(self) -> list[int] | None:
        """The episodes training reads; None = all of them."""
        return self.split.train if self.split is not None and self.split.held_out else None

    def raw_state(self, raw: dict) -> torch.Tensor:
        """The raw state vector of a collated batch (the state features concatenated)."""
        return self.spec.gather_state(raw)

    def raw_action(self, raw: dict) -> torch.Tensor:
        """The raw action chunks of a collated batch (the action features concatenated)."""
        return self.spec.gather_action(raw)

    def action_is_pad(self, raw: dict) -> torch.Tensor:
        """[B, T] True where an action step lies past the episode's end."""
        return raw[f"{self.features.features('action')[0]}_is_pad"]

    def dataset_meta(self) -> dict[str, Any]:
        """modality.json and stats.json contents of what this run normalizes with, and split.json, which
        episodes it held out (for checkpoints)."""
        meta = {"modality.json": self.features.modality, "stats.json": self.stats}
        if self.split is not None:
            meta["split.json"] = self.split.facts()
        return meta


def plan_data(cfg: TrainConfig, meta_dir: Path | None = None) -> FeatureMap:
    """The dataset's metadata and which features feed the model, from metadata only (cheap): a dataset that
    cannot be used stops here, before any heavy work. Statistics the dataset already holds are checked too."""
    import vla_io

    root = Path(cfg.data.dataset)
    if not root.is_dir():
        raise DataError(f"data.dataset: {root} is not a directory (expected a LeRobot dataset root)")
    try:
        meta = vla_io.DatasetMeta(root)
    except (FileNotFoundError, KeyError, ValueError, vla_io.VlaIoError) as err:
        raise DataError(f"cannot use dataset {root} (data.dataset): {_reason(err)}") from err
    fmap = map_features(cfg, meta, root, modality_file=meta_dir / "modality.json" if meta_dir else None)
    own = meta.stats or {}
    used = fmap.features("state") + fmap.features("action")
    if meta_dir is None and all(_complete(own.get(key)) for key in used):
        _spec(cfg, fmap, own, horizon=1, source=f"{root / 'meta'}")  # NaN / inf: an error now
    return fmap


def plan_split(cfg: TrainConfig, fmap: FeatureMap) -> EpisodeSplit:
    """The training and held-out episodes of `data.val_episodes` (metadata only; said in one log line).
    DataError naming the setting when no episode would be left to train on."""
    episodes = [episode.index for episode in fmap.meta.episodes if episode.length > 0]
    split = split_episodes(episodes, cfg.data.val_episodes)
    # Episodes without frames are never held out (nothing to score); training's reader skips them, warning.
    empty = [episode.index for episode in fmap.meta.episodes if episode.length == 0]
    split = EpisodeSplit(sorted(split.train + empty), split.held_out) if empty else split
    log.info("%s", describe_split(split, cfg.data.val_episodes, validates=cfg.eval.every > 0))
    return split


def open_dataset(
    cfg: TrainConfig,
    *,
    model_horizon: int,
    progress: bool,
    meta_dir: Path | None = None,
    plan: FeatureMap | None = None,
    split: EpisodeSplit | None = None,
) -> TrainingData:
    """The LeRobot dataset of `data.dataset` with action chunks (only `split.train`'s episodes when a split
    is given), its cameras and its embodiment spec.

    Statistics: from `meta_dir` (a checkpoint's dataset_meta, with its modality.json) when given, else the
    dataset's own where complete, else computed once from all of its rows, held-out episodes included (so
    they do not depend on data.val_episodes), and cached outside the dataset (vla_io.dataset_stats).
    """
    import vla_io

    fmap = plan or plan_data(cfg, meta_dir)
    root = fmap.root
    episodes = split.train if split is not None and split.held_out else None
    horizon = cfg.data.action_horizon or model_horizon
    if horizon > model_horizon:
        raise ConfigError(
            "data.action_horizon", f"{horizon} exceeds the model's action_horizon {model_horizon}"
        )
    fps = float(fmap.meta.fps)
    chunk = [i / fps for i in range(horizon)]
    try:
        dataset = vla_io.LeRobotDataset(
            root,
            episodes=episodes,
            delta_timestamps={key: chunk for key in fmap.features("action")},
            video_keys=fmap.cameras,
            image_dtype="uint8",
            decode_device=cfg.data.decode_device,
            progress=progress,
        )
    except (FileNotFoundError, KeyError, ValueError, vla_io.VlaIoError) as err:
        raise DataError(f"cannot use dataset {root} (data.dataset): {_reason(err)}") from err
    cameras = list(dataset.video_keys)  # with no selection: the cameras whose files exist
    if not cameras:
        raise DataError(f"dataset {root} has no videos to feed the model (data.dataset)")
    used = fmap.features("state") + fmap.features("action")
    if meta_dir is not None:
        stats = _read_json(meta_dir / "stats.json")
        source = str(meta_dir)
    else:
        try:
            stats = vla_io.dataset_stats(_all_episodes(dataset, fmap, used), used)
        except (KeyError, ValueError, vla_io.VlaIoError) as err:  # a held-out episode's file is read here
            raise DataError(f"cannot use dataset {root} (data.dataset): {_reason(err)}") from err
        source = f"{root / 'meta'} (or statistics computed from its rows)"
    stats = {key: {k: np.asarray(v).tolist() for k, v in stats[key].items()} for key in used if key in stats}
    spec = _spec(cfg, fmap, stats, horizon, source)
    return TrainingData(root, dataset, spec, cameras, horizon, fmap, stats, split)


def _reason(err: BaseException) -> str:
    """An error's message (a KeyError's str() wraps it in quotes)."""
    return str(err.args[0]) if isinstance(err, KeyError) and err.args else str(err)


def _all_episodes(dataset, fmap: FeatureMap, used: list[str]):
    """What statistics are taken from: `dataset` when it reads every episode or the dataset's own statistics
    are complete (then nothing is computed); else the whole dataset's rows (its table only, no video)."""
    import vla_io

    own = fmap.meta.stats or {}
    if dataset.num_episodes == len(fmap.meta.episodes) or all(_complete(own.get(key)) for key in used):
        return dataset
    return vla_io.LeRobotDataset(fmap.root, video_keys=[], progress=False)


def _complete(stats: dict | None) -> bool:
    return stats is not None and all(name in stats for name in ("min", "max", "mean", "std"))


def _read_json(path: Path) -> dict:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError) as err:
        raise DataError(
            f"{path}: cannot read the statistics the checkpoint was trained with ({err})"
        ) from err


def _spec(
    cfg: TrainConfig, fmap: FeatureMap, stats: dict, horizon: int, source: str
) -> gr00t_model.EmbodimentSpec:
    """Joint groups with their statistics, as the model's processor normalizes them."""
    tag = cfg.data.embodiment_tag
    if tag not in gr00t_model.EMBODIMENT_TAGS:
        raise ConfigError(
            "data.embodiment_tag",
            f"{tag!r} is not one of the allowed values: {', '.join(sorted(gr00t_model.EMBODIMENT_TAGS))}",
        )
    try:
        return gr00t_model.EmbodimentSpec.from_modality(
            fmap.modality, stats, tag, action_horizon=horizon, source=source
        )
    except (KeyError, ValueError) as err:
        raise DataError(f"cannot build the state/action normalization ({fmap.source}): {err}") from err


def make_processor(
    data: TrainingData, model_config, tokenizer, *, vlm_seq_len: int | None, image_mode: str = "passthrough"
) -> gr00t_model.GR00TProcessor:
    """The GR00T processor for this dataset, padding prompts to one fixed length (graphs need it). In
    training, images pass through untouched for `image_transform`; `infer` prepares them as deployment does,
    in the processor ("torch")."""
    config = gr00t_model.ProcessorConfig(num_images=len(data.camera_keys), image_mode=image_mode)
    processor = gr00t_model.GR00TProcessor(model_config, data.spec, tokenizer=tokenizer, config=config)
    if vlm_seq_len is None:  # the longest prompt of any task of the dataset
        tasks = list(data.dataset.meta.tasks.values())
        vlm_seq_len = max(len(processor.token_ids(task)) for task in tasks)
    processor.config.vlm_seq_len = vlm_seq_len
    return processor


def host_transform(data: TrainingData, processor) -> Callable[[dict], dict]:
    """The pipeline's L2 step: raw collated batch -> model inputs (tokens, normalized state/action).

    Cameras stay separate (sizes and aspect ratios may differ): in the processor's passthrough mode each
    goes on under its own key of CAMERA_SLOTS, for `image_transform` to letterbox and resize, then stack.
    `sample_seed` goes on too: it keys that transform's random crops and jitter.

    A NaN or infinite raw state or action value stops the run here, on the host, before normalization (which
    clips +-inf to +-1 and would train on it silently): DataError naming the feature, episode and frame
    (`check_finite`). Such a sample decodes fine, so it is not skipped against `data.max_bad_fraction` (that
    budget is for undecodable video); fix or drop the rows (`vla-io check DATASET` lists them).
    """
    cameras, horizon = data.camera_keys, data.horizon

    def transform(raw: dict) -> dict:
        images = [raw[key] for key in cameras]  # per camera uint8 [B, C, H, W]
        state, action = data.raw_state(raw), data.raw_action(raw)
        check_finite(raw, state, action, data)
        out = processor({"images": images, "state": state, "action": action}, tasks=raw["task"])
        if isinstance(out.get("images"), list):  # passthrough: the device step prepares them
            out.update(zip(CAMERA_SLOTS, out.pop("images")))
        # Steps past the episode's end repeat its last action; they carry no loss.
        real = (~data.action_is_pad(raw).bool()).to(out["action_mask"].dtype)
        out["action_mask"][:, :horizon] *= real[:, :, None]
        out["episode_index"] = raw["episode_index"]
        if "frame_index" in raw:  # names the frame of a sample with a NaN
            out["frame_index"] = raw["frame_index"]
        if "sample_seed" in raw:  # vla_io.Pipeline's batches carry it; a plain DataLoader's do not
            out["sample_seed"] = raw["sample_seed"]
        return out

    return transform


def check_finite(raw: dict, state: torch.Tensor, action: torch.Tensor, data: TrainingData) -> None:
    """DataError naming every sample (episode, frame, feature, value index) whose raw state [B, D] or action
    chunk [B, T, D] holds NaN/inf. One isfinite pass over small host tensors: cheap beside the decode."""
    found = []
    for kind, values in (("state", state), ("action", action)):
        values = torch.as_tensor(values)
        if not values.is_floating_point() or bool(torch.isfinite(values).all()):
            continue
        features = (data.spec.state_features if kind == "state" else data.spec.action_features) or []
        for sample in (
            torch.nonzero(~torch.isfinite(values).reshape(len(values), -1).all(dim=1)).flatten().tolist()
        ):
            bad = torch.nonzero(~torch.isfinite(values[sample]))[0].tolist()  # [col] or [step, col]
            step, col = (bad[0], bad[1]) if len(bad) == 2 else (0, bad[0])
            feature, col = _feature_at(features, col, kind)
            frame = _frame(raw, sample)
            frame = "unknown" if frame is None else frame + step
            value = float(values[sample][tuple(bad)])
            found.append(
                f"episode {_value(raw.get('episode_index'), sample)}, frame {frame}: {feature}[{col}] is {value}"
            )
    found = list(dict.fromkeys(found))  # the samples of one chunk name the same frame
    if found:
        shown = "; ".join(found[:8]) + (f"; and {len(found) - 8} more samples" if len(found) > 8 else "")
        raise DataError(
            f"dataset {data.root} holds NaN/inf raw values ({shown}). Fix or drop those frames "
            "(`vla-io check DATASET` lists them all)"
        )


def _feature_at(features: list[tuple[str, int]], col: int, kind: str) -> tuple[str, int]:
    """(feature, index in it) of column `col` of the concatenated raw vector."""
    for key, width in features:
        if col < width:
            return key, col
        col -= width
    return kind, col


def _value(values: Any, i: int) -> Any:
    if values is None:
        return "unknown"
    return int(torch.as_tensor(values).reshape(-1)[i])


def _frame(raw: dict, i: int) -> int | None:
    frames = raw.get("frame_index")
    return None if frames is None else int(torch.as_tensor(frames).reshape(-1)[i])


def image_transform(processor, num_cameras: int, *, augment: bool, backend: str):
    """The one image transform of training (vla_io.ImageAugment on uint8 frames, on the GPU in vla-io's
    pipeline, on the CPU in the LeRobot-style baseline's workers), with the release's numbers from the
    model's `image_spec`: per camera, letterbox to the model's aspect ratio, crop `crop_fraction` of each side
    (random place with `augment`, the same for every camera of a sample as the release's replayed crop, else
    the centre), resize to the model's image size; with `augment` the release's color jitter; then normalize
    and stack under `pixel_values`.

    Random draws come from each sample's `sample_seed` (a function of the run's seed, the epoch and the
    sample's place in the epoch's global order, hence of the rank): identical after a resume, different
    on every rank.
    """
    import vla_io

    spec = processor.image_spec
    area = spec.crop_fraction**2
    jitter = dict(
        brightness=spec.brightness,
        contrast=spec.contrast,
        saturation=spec.saturation,
        hue=spec.hue * 360.0,  # a fraction of a turn -> degrees
    )
    config = vla_io.ImageTransformConfig(
        size=spec.size,
        crop_scale=(area, area),
        crop_ratio=None,  # the letterboxed frame's ratio, which is the output's
        crop_position="random" if augment else "center",
        letterbox=spec.letterbox,
        same_across_views=True,
        mean=(spec.mean,) * 3,
        std=(spec.std,) * 3,
        **(jitter if augment else {}),
    )
    return vla_io.ImageAugment(
        config, keys=list(CAMERA_SLOTS[:num_cameras]), backend=backend, stack_as="pixel_values"
    )


class PipelineSource:
    """An endless, resumable stream of training batches from a vla_io.Pipeline (epochs chained)."""

    def __init__(self, pipeline: Any, check_first: Callable[[dict], None] | None = None) -> None:
        self.pipeline = pipeline
        self._iter = None
        self._check_first = check_first
        self._device_s = 0.0

    def __next__(self) -> dict:
        while True:
            if self._iter is None:
                self._iter = iter(self.pipeline)
            try:
                batch = next(self._iter)
                break
            except StopIteration:
                self._iter = None  # next epoch; the workers are already loading it
        batch = {key: batch[key] for key in KEEP_KEYS if key in batch}
        if self._check_first is not None:
            check, self._check_first = self._check_first, None
            check(batch)
        return batch

    def state_dict(self) -> dict:
        return self.pipeline.state_dict()

    def load_state_dict(self, state: dict) -> None:
        self.pipeline.load_state_dict(state)
        self._iter = None

    def timings(self) -> dict[str, float]:
        # The copy to the device and the device transform, as the pipeline measured them on its thread.
        total = float(self.pipeline.stats().get("device_s", 0.0))
        delta, self._device_s = max(0.0, total - self._device_s), total
        return {"h2d": delta}

    def close(self) -> None:
        self.pipeline.close()
