"""What the ablation ladder's baseline rows run and no library needs: torch DDP with torch's AdamW behind the
GradSync protocol (`optimizations.comm=ddp`), and the LeRobot-style data path (`optimizations.data=dataloader`:
a torch DataLoader over single samples). The third baseline, reducing every bucket after backward
(`comm=allreduce_after_backward`), is vla-overlap's wrapper with `overlap_grad_reduce=False` (`_comm.py`)."""

from __future__ import annotations

from contextlib import AbstractContextManager
from typing import Any

import torch
from torch import nn


def ddp_with_adamw(
    model: nn.Module, groups: list[dict[str, Any]], adamw: dict[str, Any]
) -> tuple[nn.parallel.DistributedDataParallel, torch.optim.AdamW]:
    """torch DistributedDataParallel around `model` (on its device, the default process group) and a torch
    AdamW over the parameter `groups` with the `adamw` options."""
    device = next(model.parameters()).device
    ids = [device] if device.type == "cuda" else None
    ddp = nn.parallel.DistributedDataParallel(model, device_ids=ids)
    return ddp, torch.optim.AdamW(groups, **adamw)


class DDPGradSync:
    """torch DistributedDataParallel as a GradSync: DDP reduces from its own hooks during the last backward,
    so start/finish have nothing left to do. Eager only (the config refuses graphs with comm=ddp)."""

    def __init__(self, ddp: nn.parallel.DistributedDataParallel) -> None:
        self._ddp = ddp

    def zero(self) -> None:
        self._ddp.zero_grad(set_to_none=True)

    def no_sync(self) -> AbstractContextManager:
        return self._ddp.no_sync()

    def launch_in_backward(self) -> AbstractContextManager:
        raise RuntimeError("torch DDP cannot run inside CUDA graphs (comm=ddp needs graph=eager)")

    def start(self) -> None:
        pass

    def finish(self) -> None:
        pass

    def mark_synced(self) -> None:
        pass


class LeRobotStyleSource:
    """The baseline's data path, as LeRobot-style training runs it: a torch DataLoader with worker processes
    and pinned memory over single samples of the dataset (each sample decodes its own frames, a decoder
    opened for it), the GR00T processor and the image transform in the workers (the same transform as the
    pipeline's, on the CPU: crop, resize, color jitter), and the training thread copying each batch to the
    device. A BatchSource; resumable by sample position."""

    def __init__(self, cfg, data, processor, env, check_first=None) -> None:
        import vla_io

        root, fps = data.root, float(data.dataset.meta.fps)
        samples = vla_io.LeRobotDataset(
            root,
            episodes=data.train_episodes,  # the held-out episodes (data.val_episodes) stay out
            delta_timestamps={
                key: [i / fps for i in range(data.horizon)] for key in data.features.features("action")
            },
            video_keys=data.camera_keys,
            image_dtype="uint8",
            max_open_videos=1,  # no decoder kept between samples: one open and one seek per frame
            progress=False,
        )
        self._dataset = _Samples(samples)
        self._collate = _Collate(data, processor, augment=cfg.data.augment)
        self._cfg, self._env, self._check_first = cfg, env, check_first
        self._epoch, self._position, self._iter = 0, 0, None

    def _loader(self, skip: int):
        import torch.utils.data as tud

        sampler = tud.distributed.DistributedSampler(
            self._dataset, num_replicas=self._env.world_size, rank=self._env.rank,
            shuffle=self._cfg.data.shuffle, seed=self._cfg.seed, drop_last=True,
        )  # fmt: skip
        sampler.set_epoch(self._epoch)
        batch = self._cfg.data.batch_size
        indices = list(sampler)[skip * batch :]
        workers = self._cfg.data.num_workers
        return iter(tud.DataLoader(
            _Subset(self._dataset, indices, self._cfg.seed, self._epoch), batch_size=batch, num_workers=workers,
            pin_memory=self._env.device.type == "cuda", collate_fn=self._collate, drop_last=True,
            prefetch_factor=2 if workers else None,
        ))  # fmt: skip

    def __next__(self) -> dict:
        while True:
            if self._iter is None:
                self._iter = self._loader(self._position)
            try:
                batch = next(self._iter)
                break
            except StopIteration:
                self._iter, self._epoch, self._position = None, self._epoch + 1, 0
        self._position += 1
        device = self._env.device
        batch = {
            k: v.to(device, non_blocking=True) if isinstance(v, torch.Tensor) else v for k, v in batch.items()
        }
        if self._check_first is not None:
            check, self._check_first = self._check_first, None
            check(batch)
        return batch

    def state_dict(self) -> dict:
        return {"epoch": self._epoch, "position": self._position}

    def load_state_dict(self, state: dict) -> None:
        self._epoch, self._position, self._iter = int(state["epoch"]), int(state["position"]), None

    def timings(self) -> dict:
        return {}

    def close(self) -> None:
        self._iter = None  # the DataLoader's workers exit with their iterator


class _Samples:
    """vla_io.LeRobotDataset as a map-style torch dataset of single samples."""

    def __init__(self, dataset) -> None:
        self.dataset = dataset

    def __len__(self) -> int:
        return len(self.dataset)

    def __getitem__(self, index: int) -> dict:
        return self.dataset[index]


def sample_seed(seed: int, epoch: int, index: int) -> int:
    """A sample's augmentation seed, from the run's seed, the epoch and the sample's index: the workers draw
    independent crops and jitter, and a resumed run draws the same ones."""
    import numpy as np

    return int(np.random.SeedSequence([seed, epoch, index]).generate_state(1, np.uint64)[0] >> 1)


class _Subset:
    """The epoch's samples in order, each with its seed (computed in the worker that loads it)."""

    def __init__(self, dataset, indices: list[int], seed: int, epoch: int) -> None:
        self.dataset, self.indices, self.seed, self.epoch = dataset, indices, seed, epoch

    def __len__(self) -> int:
        return len(self.indices)

    def __getitem__(self, i: int) -> dict:
        index = self.indices[i]
        return self.dataset[index] | {"sample_seed": sample_seed(self.seed, self.epoch, index)}


class _Collate:
    """Stack samples, then the processor and the image transform (in the worker): model inputs with
    normalized pixel values."""

    def __init__(self, data, processor, augment: bool) -> None:
        from .data.dataset import KEEP_KEYS, host_transform, image_transform

        self.transform, self.keep = host_transform(data, processor), KEEP_KEYS
        self.images = image_transform(processor, len(data.camera_keys), augment=augment, backend="torch")

    def __call__(self, samples: list[dict]) -> dict:
        import torch.utils.data as tud

        out = self.images(self.transform(tud.default_collate(samples)))
        return {k: out[k] for k in self.keep if k in out}
