"""The data side of a run, from vla_io and gr00t_model: the LeRobot dataset, the GR00T processor as the
pipeline's host-thread transform, image augmentation on the device, and the Pipeline as an endless,
resumable BatchSource. Errors about the dataset are re-raised as DataError with the field to change."""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import gr00t_model
import torch

from ._config import TrainConfig
from ._errors import ConfigError, DataError

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
)
"""What the training step receives of a pipeline batch (tensors only: graphs need fixed inputs)."""
RELEASE_JITTER = {"brightness": 0.1, "contrast": 0.1, "saturation": 0.1, "hue": 36.0}
"""The release's color jitter (0.1 each; hue 0.1 of a turn = 36 degrees)."""


@dataclass
class TrainingData:
    """A dataset opened for one model: which cameras, how to normalize, how long the action chunks are."""

    root: Path
    dataset: Any
    spec: gr00t_model.EmbodimentSpec
    camera_keys: list[str]
    horizon: int


def open_dataset(
    cfg: TrainConfig, *, model_horizon: int, progress: bool, meta_dir: Path | None = None
) -> TrainingData:
    """The LeRobot dataset of `data.dataset` with action chunks, its cameras and its embodiment spec
    (normalization statistics from `meta_dir`, default the dataset's own meta/)."""
    import vla_io

    root = Path(cfg.data.dataset)
    if not root.is_dir():
        raise DataError(f"data.dataset: {root} is not a directory (expected a LeRobot dataset root)")
    horizon = cfg.data.action_horizon or model_horizon
    if horizon > model_horizon:
        raise ConfigError(
            "data.action_horizon", f"{horizon} exceeds the model's action_horizon {model_horizon}"
        )
    try:
        meta = vla_io.DatasetMeta(root)
        cameras = None if cfg.data.cameras is None else _camera_keys(meta, cfg.data.cameras, root)
        fps = float(meta.fps)
        dataset = vla_io.LeRobotDataset(
            root,
            delta_timestamps={"action": [i / fps for i in range(horizon)]},
            video_keys=cameras,
            image_dtype="uint8",
            decode_device=cfg.data.decode_device,
            progress=progress,
        )
    except (FileNotFoundError, KeyError, ValueError, vla_io.VlaIoError) as err:
        raise DataError(f"cannot use dataset {root} (data.dataset): {err}") from err
    cameras = list(dataset.video_keys)  # with no selection: the cameras whose files exist
    if not cameras:
        raise DataError(f"dataset {root} has no videos to feed the model (data.dataset)")
    spec = _embodiment_spec(cfg, meta_dir or root / "meta", horizon)
    return TrainingData(root, dataset, spec, cameras, horizon)


def _camera_keys(meta: Any, wanted: list[str], root: Path) -> list[str]:
    """Feature keys of the wanted cameras; names may be modality.json's short names or full keys."""
    available = list(meta.video_keys)
    videos = meta.modality.slices("video") if meta.modality is not None else {}
    short = {name: entry.key for name, entry in videos.items()}
    for key in available:
        short.setdefault(key.removeprefix("observation.images."), key)
    keys = []
    for name in wanted:
        key = short.get(name, name if name in available else None)
        if key is None or key not in available:
            names = sorted(short)
            raise DataError(
                f"data.cameras: camera {name!r} is not in dataset {root}; it has {', '.join(names) or 'no cameras'}"
            )
        keys.append(key)
    return keys


def _embodiment_spec(cfg: TrainConfig, meta: Path, horizon: int) -> gr00t_model.EmbodimentSpec:
    """Joint groups from meta/modality.json with statistics from meta/stats.json, filtered to the config."""
    tag = cfg.data.embodiment_tag
    if tag not in gr00t_model.EMBODIMENT_TAGS:
        raise ConfigError(
            "data.embodiment_tag",
            f"{tag!r} is not one of the allowed values: {', '.join(sorted(gr00t_model.EMBODIMENT_TAGS))}",
        )
    try:
        spec = gr00t_model.EmbodimentSpec.from_lerobot_meta(meta, tag, action_horizon=horizon)
    except (FileNotFoundError, KeyError, ValueError) as err:
        raise DataError(
            f"{meta}: cannot build the state/action normalization from modality.json and stats.json "
            f"({err}); every normalized key needs min/max (or mean/std) statistics"
        ) from err
    spec.state = _select(spec.state, cfg.data.state_keys, "data.state_keys", meta)
    spec.action = _select(spec.action, cfg.data.action_keys, "data.action_keys", meta)
    return spec


def _select(groups: list, wanted: list[str] | None, field: str, meta: Path) -> list:
    if wanted is None:
        return groups
    by_name = {g.name: g for g in groups}
    unknown = [name for name in wanted if name not in by_name]
    if unknown:
        raise DataError(
            f"{field}: {unknown} not in {meta}/modality.json; it has {', '.join(by_name) or 'none'}"
        )
    return [by_name[name] for name in wanted]


def make_processor(
    data: TrainingData, model_config, tokenizer, *, augment_on_device: bool, vlm_seq_len: int | None
) -> gr00t_model.GR00TProcessor:
    """The GR00T processor for this dataset, padding prompts to one fixed length (graphs need it)."""
    config = gr00t_model.ProcessorConfig(
        num_images=len(data.camera_keys),
        image_mode="passthrough" if augment_on_device else "torch",
    )
    processor = gr00t_model.GR00TProcessor(model_config, data.spec, tokenizer=tokenizer, config=config)
    if vlm_seq_len is None:  # the longest prompt of any task of the dataset
        tasks = list(data.dataset.meta.tasks.values())
        vlm_seq_len = max(len(processor.token_ids(task)) for task in tasks)
    processor.config.vlm_seq_len = vlm_seq_len
    return processor


def host_transform(data: TrainingData, processor) -> Callable[[dict], dict]:
    """The pipeline's L2 step: raw collated batch -> model inputs (tokens, normalized state/action)."""
    cameras, horizon = data.camera_keys, data.horizon

    def transform(raw: dict) -> dict:
        images = torch.stack([raw[key] for key in cameras], dim=1)  # (B, cameras, C, H, W) uint8
        out = processor({"images": images, "state": raw["observation.state"], "action": raw["action"]},
                        tasks=raw["task"])  # fmt: skip
        # Steps past the episode's end repeat its last action; they carry no loss.
        real = (~raw["action_is_pad"].bool()).to(out["action_mask"].dtype)
        out["action_mask"][:, :horizon] *= real[:, :, None]
        out["episode_index"] = raw["episode_index"]
        return out

    return transform


def device_augment(processor, enabled: bool):
    """Random crop + color jitter + normalization of uint8 frames on the device (vla_io.ImageAugment),
    with the release's settings; None when the processor prepares the images itself."""
    if not enabled:
        return None
    import vla_io

    spec = processor.image_spec
    area = spec.crop_fraction**2
    config = vla_io.ImageTransformConfig(
        size=spec.size,
        crop_scale=(area, area),
        crop_ratio=(1.0, 1.0),
        mean=(spec.mean,) * 3,
        std=(spec.std,) * 3,
        **RELEASE_JITTER,
    )
    return vla_io.ImageAugment(config, keys=["images"], stack_as="pixel_values")


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
