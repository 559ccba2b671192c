"""Tiny plain-torch stand-ins for the model and the data source, for testing the training loop only.

Loaded by conftest.py (and by subprocess scripts) under the module name `gr00t_train_standins`."""

from __future__ import annotations

import time
from pathlib import Path

import gr00t_train
import torch
from safetensors.torch import load_file, save_file
from torch import nn

IN, OUT = 8, 4


class TinyRegressor(nn.Module):
    """Two linear layers with dropout, so both the weights and the random streams matter."""

    def __init__(self, dropout: float = 0.1) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(IN, 32), nn.GELU(), nn.Dropout(dropout), nn.Linear(32, OUT))
        self.frozen = nn.Linear(OUT, OUT)  # frozen parameters are left alone by the optimizer
        self.frozen.requires_grad_(False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.frozen(self.net(x))


def noisy_mse(module: nn.Module, batch: dict) -> torch.Tensor:
    """Regression loss with target noise drawn from the global torch stream (as flow matching does)."""
    target = batch["y"] + 0.01 * torch.randn_like(batch["y"])
    return nn.functional.mse_loss(module(batch["x"]), target)


class SyntheticSource:
    """Deterministic batches: batch k depends only on (seed, rank, k); `nan_at` plants a NaN input."""

    def __init__(self, batch_size: int, seed: int = 0, rank: int = 0, nan_at: int | None = None) -> None:
        self.batch_size, self.seed, self.rank, self.nan_at = batch_size, seed, rank, nan_at
        self.position = 0
        self.closed = False
        g = torch.Generator().manual_seed(1234)
        self.true_w = torch.randn(IN, OUT, generator=g)

    def __next__(self) -> dict:
        g = torch.Generator().manual_seed(self.seed * 100_003 + self.rank * 1_009 + self.position)
        x = torch.randn(self.batch_size, IN, generator=g)
        if self.nan_at is not None and self.position == self.nan_at:
            x[0, 0] = float("nan")
        start = (self.position * self.batch_size) % 1000
        ids = torch.arange(start, start + self.batch_size) // 2  # two frames per episode
        frames = torch.arange(start, start + self.batch_size) % 2
        self.position += 1
        return {"x": x, "y": x @ self.true_w, "episode_index": ids, "frame_index": frames}

    def state_dict(self) -> dict:
        return {"position": self.position}

    def load_state_dict(self, state: dict) -> None:
        self.position = int(state["position"])

    def timings(self) -> dict:
        return {}

    def close(self) -> None:
        self.closed = True


class Samples:
    """A regression dataset for vla_io.Pipeline: sample i's input is drawn from a generator seeded by i."""

    def __init__(self, n: int = 96) -> None:
        g = torch.Generator().manual_seed(1234)
        true_w = torch.randn(IN, OUT, generator=g)
        self.x = torch.stack([torch.randn(IN, generator=torch.Generator().manual_seed(i)) for i in range(n)])
        self.y = self.x @ true_w

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, i: int) -> dict:
        return {
            "x": self.x[i],
            "y": self.y[i],
            "index": torch.tensor(i),
            "episode_index": torch.tensor(i // 2),
        }


class PipelineSource:
    """vla_io.Pipeline over `Samples` in the training thread, epochs chained: the data position is a place in
    the epoch's global order, so a resume at another world size continues it."""

    def __init__(self, batch_size: int, seed: int = 0, rank: int = 0, world_size: int = 1) -> None:
        import vla_io

        self.pipeline = vla_io.Pipeline(
            Samples(), batch_size, synchronous=True, device="cpu", seed=seed, rank=rank, world_size=world_size
        )
        self._iter = None
        self.seen: list[list[int]] = []
        """The sample indices of every batch delivered, in order."""

    def __next__(self) -> dict:
        while True:
            if self._iter is None:
                self._iter = iter(self.pipeline)
            try:
                batch = next(self._iter)
                break
            except StopIteration:
                self._iter = None
        self.seen.append(batch["index"].tolist())
        return batch

    def state_dict(self) -> dict:
        return self.pipeline.state_dict()

    def load_state_dict(self, state: dict) -> None:
        self.pipeline.load_state_dict(state)
        self._iter = None

    def timings(self) -> dict:
        return {}

    def close(self) -> None:
        self.pipeline.close()


def seeded_mse(module: nn.Module, batch: dict) -> torch.Tensor:
    """Regression loss with target noise drawn from each sample's seed: the same whatever rank loads it."""
    noise = torch.stack(
        [torch.randn(OUT, generator=torch.Generator().manual_seed(int(s))) for s in batch["sample_seed"]]
    )
    return nn.functional.mse_loss(module(batch["x"]), batch["y"] + 0.01 * noise)


def make_elastic_parts(batch_size: int, seed: int = 0, rank: int = 0, world_size: int = 1):
    """Stand-ins whose step depends on the samples only, not on the rank that loads them (no dropout, noise
    from sample seeds): runs at different world sizes with the same global batch agree up to rounding."""
    torch.manual_seed(seed)
    return gr00t_train.TrainParts(
        model=TinyRegressor(dropout=0.0),
        loss_fn=seeded_mse,
        data=PipelineSource(batch_size, seed, rank, world_size),
        save_model=save_weights,
        load_model=load_weights,
    )


def save_weights(module: nn.Module, folder: Path) -> None:
    save_file({k: v.contiguous() for k, v in module.state_dict().items()}, str(folder / "model.safetensors"))


def load_weights(module: nn.Module, folder: Path) -> None:
    module.load_state_dict(load_file(str(folder / "model.safetensors")))


def make_parts(batch_size: int = 4, seed: int = 0, rank: int = 0, **source_kwargs) -> gr00t_train.TrainParts:
    torch.manual_seed(seed)  # same initial weights on every rank and in every run
    return gr00t_train.TrainParts(
        model=TinyRegressor(),
        loss_fn=noisy_mse,
        data=SyntheticSource(batch_size, seed, rank, **source_kwargs),
        save_model=save_weights,
        load_model=load_weights,
        flops_per_sample=6.0 * (IN * 32 + 32 * OUT),
        tokens_per_sample=2.0,
    )


def small_config(tmp: Path, **overrides) -> gr00t_train.TrainConfig:
    """A CPU config for the stand-ins: few steps, torch DDP (works at any world size), quiet."""
    cfg = gr00t_train.TrainConfig(
        steps=12,
        device="cpu",
        output_dir=str(tmp / "run"),
        data=gr00t_train.DataConfig(batch_size=4),
        optim=gr00t_train.OptimConfig(lr=1e-2, warmup_ratio=0.1),
        optimizations=gr00t_train.OptimizationsConfig(comm="ddp", fused_optimizer=False),
        logging=gr00t_train.LoggingConfig(every=3, progress=False, plots=False, summary_skip=2),
    )
    pairs = [f"{k.replace('__', '.')}={v}" for k, v in overrides.items()]
    return gr00t_train.apply_overrides(cfg, pairs)


def elastic_config(tmp: Path, name: str, batch: int, resume: str | None, steps: int = 9, **sets):
    """The elastic-resume tests' runs: ZeRO-1, a checkpoint every 3 steps, a metrics line per step; a resume
    may change data.batch_size (to keep the global batch at another world size)."""
    overrides = dict(
        steps=steps, checkpoint__every=3, checkpoint__keep_last=5, logging__every=1, data__batch_size=batch,
        optimizations__comm="zero1_overlap", output_dir=str(tmp / name), **sets,
    )  # fmt: skip
    if resume:
        overrides |= dict(checkpoint__resume=resume, checkpoint__resume_changed="data.batch_size")
    return small_config(tmp, **overrides)


def slow_save(module: nn.Module, folder: Path) -> None:
    """Writes the weights, says so in a marker file, then hangs: the test kills the process here."""
    save_weights(module, folder)
    (folder.parent.parent / "SAVING").write_text(str(folder))
    time.sleep(600)
