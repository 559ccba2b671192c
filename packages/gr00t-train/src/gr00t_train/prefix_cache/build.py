"""Building a prefix cache: the frozen prefix run once over every training sample and augmentation variant.

vla-io's pipeline reads the training episodes in dataset order (no shuffle, every sample, the last batch
short), the GR00T processor and the image transform run as in training, and `GR00TN16.prefix_features`
computes the features, which go into a `FeatureStore` row by row, with the processor's state, action and ids
of each sample. Variant k is the pipeline's epoch k: each sample's random crop and color jitter come from
its `sample_seed`, a function of (seed, k, the sample's index), so a rebuild repeats them."""

from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import Any

import torch

from .._errors import DataError
from ..config.sections import TrainConfig
from ..data import dataset as _data
from .store import FeatureStore, quantize

log = logging.getLogger(__name__)

PER_SAMPLE = ("state", "action", "action_mask", "embodiment_id", "episode_index", "frame_index")
"""What a cached batch carries besides the features (what the trainable part and the loop's checks read)."""


def build_store(
    cfg: TrainConfig, model, data, processor, env, meta: dict[str, Any], folder: Path | None, progress: bool,
) -> tuple[FeatureStore, dict[str, float]]:  # fmt: skip
    """The features of every sample of `data` (x variants) in a FeatureStore at `folder` (None: in host
    memory); returns it and the seconds the build took: `build_s` in all, `first_batch_s` for the first batch
    (the decoding workers' start and, with compiled blocks, their compilation).

    With several processes (`env`, one host, a disk cache) each computes its share of the samples, as the
    pipeline deals them out, into the same files: rank 0 creates them, every rank writes its rows, rank 0
    completes the folder (`FeatureStore.finish`) and the others open it."""
    import vla_io

    settings = cfg.data.prefix_cache
    variants, count = settings.variants, len(data.dataset)
    batch_size = min(settings.build_batch_size or cfg.data.batch_size, count)
    augment = _data.image_transform(
        processor, len(data.camera_keys), augment=cfg.data.augment, backend=cfg.data.augment_backend
    )
    shares = dict(seed=cfg.seed, rank=env.rank, world_size=env.world_size, shuffle=False, drop_last=False)
    pipeline = vla_io.Pipeline(
        data.dataset,
        batch_size,
        transform=_data.host_transform(data, processor),
        device_transform=augment,
        num_workers=cfg.data.num_workers,
        prefetch_per_worker=cfg.data.prefetch,
        device=str(env.device),
        timeout_s=cfg.data.worker_timeout_s,
        **shares,
        **({"start_method": "spawn"} if cfg.data.decode_device == "cuda" else {}),
    )
    sampler = vla_io.EpochSampler(count, batch_size, **shares)  # which samples each of its batches holds
    started = time.perf_counter()
    first = None
    store = None
    bar = _bar(variants * sampler.per_rank, progress)
    try:
        for variant in range(variants):  # the pipeline's epoch k is variant k
            batches = 0
            for batch in pipeline:
                rows = torch.from_numpy(sampler.task(variant, batches).indices)
                real = batch["state"].shape[0]
                if len(rows) != real:
                    raise DataError(f"prefix cache: a batch of {real} samples where {len(rows)} were due")
                if store is None:
                    model.validate_batch(batch)  # the first batch: keys, shapes, image-token counts
                features = model.prefix_features(_padded(batch, batch_size))
                features = {key: value[:real] for key, value in features.items()}
                if store is None:
                    meta["layout"] = _layout(meta, features, batch, count)
                    store = _create(meta, folder, env)
                stored, scale = quantize(features["hidden"], settings.dtype)
                store.write("hidden", rows, stored, variant)
                if scale is not None:
                    store.write("scale", rows, scale, variant)
                if variant == 0:
                    store.write("valid", rows, features["valid"])
                    store.write("image_mask", rows, features["image_mask"])
                    for key in PER_SAMPLE:
                        store.write(key, rows, torch.as_tensor(batch[key]))
                batches += 1
                first = first or time.perf_counter() - started  # its results are on the host: finished
                bar.update(real)
            if batches != sampler.batches_in(variant):
                raise DataError(
                    f"prefix cache: the pipeline delivered {batches} of {sampler.batches_in(variant)} batches "
                    f"of {data.root}"
                )
    except vla_io.VlaIoError as err:
        raise DataError(f"prefix cache: cannot read dataset {data.root} (data.dataset): {err}") from err
    finally:
        pipeline.close()
        bar.close()
    if store is not None:
        store.flush()
    env.barrier()  # every rank's rows are written
    return store, {"build_s": time.perf_counter() - started, "first_batch_s": first or 0.0}


def _create(meta: dict, folder: Path | None, env) -> FeatureStore:
    """The store's empty arrays: created here with one process; with several, rank 0 creates the files
    and the others open them for writing once they exist (every rank reaches its first batch)."""
    if env.world_size == 1:
        return FeatureStore.create(meta, folder)
    store = FeatureStore.create(meta, folder) if env.is_main else None
    env.barrier()
    return store or FeatureStore.open(folder, meta, writable=True)


def _padded(batch: dict, size: int) -> dict:
    """The last, short batch filled up to `size` with copies of its last sample: every forward of the build
    has one shape (compiled blocks compile it once, and every sample's GEMMs run as in training's batches)."""
    missing = size - batch["state"].shape[0]
    if missing <= 0:
        return batch
    return {
        key: torch.cat((value, value[-1:].expand(missing, *value.shape[1:])))
        if isinstance(value, torch.Tensor) and value.ndim > 0
        else value
        for key, value in batch.items()
    }


def _layout(meta: dict, features: dict, batch: dict, count: int) -> dict[str, tuple[list[int], str]]:
    """name -> ([shape], torch dtype name) of every array, from the first batch."""
    variants = meta["variants"]
    hidden = features["hidden"]
    length, width = hidden.shape[1], hidden.shape[2]
    stored = {"bf16": "bfloat16", "fp32": "float32", "fp8": "uint8"}[meta["dtype"]]
    layout = {"hidden": ([variants, count, length, width], stored)}
    if meta["dtype"] == "fp8":
        layout["scale"] = ([variants, count, length], "float32")
    layout["valid"] = ([count, length], "bool")
    layout["image_mask"] = ([count, length], "bool")
    for key in PER_SAMPLE:
        value = torch.as_tensor(batch[key])
        layout[key] = ([count, *value.shape[1:]], str(value.dtype).removeprefix("torch."))
    meta["hidden_dtype"] = str(hidden.dtype).removeprefix("torch.")
    return {name: (list(shape), dtype) for name, (shape, dtype) in layout.items()}


def _bar(total: int, progress: bool):
    """A progress bar over the samples x variants to compute (a no-op one when progress is off)."""
    if not progress:
        return _NoBar()
    from tqdm.auto import tqdm

    return tqdm(total=total, unit="sample", desc="prefix cache", dynamic_ncols=True)


class _NoBar:
    def update(self, _: int) -> None:
        pass

    def close(self) -> None:
        pass
