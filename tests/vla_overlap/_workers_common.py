"""What the pool's worker scenarios share: tiny models, a global batch split over ranks, and the training
loops of torch DDP + AdamW (the reference) and of every vla_overlap mode."""

from __future__ import annotations

import contextlib
import dataclasses
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.parallel import DistributedDataParallel
from torch.utils.checkpoint import checkpoint
from vla_overlap import DistributedAdamW, OverlapConfig, OverlapDataParallel

GLOBAL_BATCH = 12  # divisible by every world size we test
D_IN, D_OUT = 8, 4


class Block(nn.Module):
    def __init__(self, d: int) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(d)
        self.fc1 = nn.Linear(d, 2 * d)
        self.fc2 = nn.Linear(2 * d, d)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.fc2(F.gelu(self.fc1(self.norm(x))))


class ToyNet(nn.Module):
    """Blocks with a frozen projection in the middle; optional dead branch and out-of-order execution."""

    def __init__(
        self,
        d: int = 16,
        depth: int = 3,
        unused: bool = False,
        shuffled: bool = False,
        checkpointed: bool = False,
    ) -> None:
        super().__init__()
        self.embed = nn.Linear(D_IN, d)
        self.blocks = nn.ModuleList(Block(d) for _ in range(depth))
        self.frozen = nn.Linear(d, d)
        self.frozen.requires_grad_(False)
        self.head = nn.Linear(d, D_OUT)
        self.unused = nn.Linear(d, d) if unused else None
        self.order = list(range(depth))[::-1] if shuffled else list(range(depth))
        self.use_extra = unused  # the extra branch runs only while this is True
        self.checkpointed = checkpointed  # blocks under reentrant activation checkpointing

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.embed(x)
        for i in self.order:
            h = checkpoint(self.blocks[i], h, use_reentrant=True) if self.checkpointed else self.blocks[i](h)
        h = h + self.frozen(h)
        if self.unused is not None and self.use_extra:
            h = h + self.unused(h)
        return self.head(h)


def make_model(seed: int = 0, dtype: torch.dtype = torch.float32, **kwargs: Any) -> ToyNet:
    torch.manual_seed(seed)
    return ToyNet(**kwargs).to(dtype)


def batch(step: int, micro: int, rank: int, world_size: int, dtype: torch.dtype = torch.float32):
    """This rank's share of the global microbatch (step, micro): identical global data at any world size."""
    g = torch.Generator().manual_seed(1000 * step + micro)
    x = torch.randn(GLOBAL_BATCH, D_IN, generator=g)
    y = torch.randn(GLOBAL_BATCH, D_OUT, generator=g)
    per = GLOBAL_BATCH // world_size
    window = slice(rank * per, (rank + 1) * per)
    return x[window].to(dtype), y[window].to(dtype)


def params_of(module: nn.Module) -> dict[str, torch.Tensor]:
    return {name: p.detach().clone() for name, p in module.state_dict().items()}


def make_scheduler(opt: torch.optim.Optimizer) -> torch.optim.lr_scheduler.LRScheduler:
    return torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0 / (1.0 + s))


ADAMW = dict(lr=1e-2, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.1, foreach=False)

COMM_MODES = ("allreduce_after_backward", "ddp", "overlap", "zero1_overlap")
"""The modes a training loop switches between by name: our wrapper reducing after backward, torch DDP (the
reference), our wrapper overlapping, and ZeRO-1 (DistributedAdamW) on top of it."""


def build_comm_mode(
    module: nn.Module, mode: str, *, process_group: Any, config: OverlapConfig | None = None, **adamw: Any
) -> tuple[nn.Module, torch.optim.Optimizer]:
    """(model, AdamW over every trainable parameter) of one COMM_MODES entry, built from `module`."""
    params = [p for p in module.parameters() if p.requires_grad]
    if mode == "ddp":
        ddp = DistributedDataParallel(module, process_group=process_group)
        return ddp, torch.optim.AdamW(params, **adamw)
    config = config if config is not None else OverlapConfig()
    if mode == "allreduce_after_backward":
        config = dataclasses.replace(config, overlap_grad_reduce=False)
    model = OverlapDataParallel(module, config, process_group=process_group)
    if mode == "zero1_overlap":
        return model, DistributedAdamW(model, params, **adamw)
    return model, torch.optim.AdamW(params, **adamw)


def clip_grad_norm(model: nn.Module, opt: torch.optim.Optimizer, max_norm: float) -> torch.Tensor:
    """Clip to a global norm in any mode, as a loop that switches modes does: DistributedAdamW's own clip
    (over every rank's shard), else torch's clip over the optimizer's parameters in its order (our wrapper
    first finishes the gradient sync)."""
    if isinstance(opt, DistributedAdamW):
        return opt.clip_grad_norm_(max_norm)
    if isinstance(model, OverlapDataParallel):
        model.finish_grad_sync()
    return torch.nn.utils.clip_grad_norm_(
        [p for group in opt.param_groups for p in group["params"]], max_norm
    )


def run_steps(
    ctx: Any,
    model: nn.Module,
    opt: torch.optim.Optimizer,
    sched: Any,
    steps: range,
    micro: int,
    autocast: bool = False,
    clip: float | None = None,
    dtype: torch.dtype = torch.float32,
) -> list[float]:
    """The training loop every mode shares (model.zero_grad, no_sync for all but the last microbatch)."""
    norms = []
    for step in steps:
        model.zero_grad()
        for m in range(micro):
            x, y = batch(step, m, ctx.rank, ctx.world_size, dtype)
            sync = contextlib.nullcontext() if m == micro - 1 else model.no_sync()
            cast = torch.autocast("cpu", dtype=torch.bfloat16) if autocast else contextlib.nullcontext()
            with sync:
                with cast:
                    out = model(x)
                loss = F.mse_loss(out.float(), y.float()) / micro
                loss.backward()
        if clip is not None:
            norms.append(float(clip_grad_norm(model, opt, clip)))
        opt.step()
        sched.step()
    return norms


def param_groups(module: nn.Module) -> list[dict[str, Any]]:
    """Two groups, as fine-tuning recipes use: no weight decay (and a higher lr) for biases and norms."""
    trainable = [(n, p) for n, p in module.named_parameters() if p.requires_grad]
    decay = [p for n, p in trainable if p.dim() >= 2]
    rest = [p for n, p in trainable if p.dim() < 2]
    return [{"params": decay}, {"params": rest, "weight_decay": 0.0, "lr": 2e-2}]


def build(
    ctx: Any,
    mode: str,
    group: Any = None,
    bucket_elements: int = 600,
    overwrite: bool = True,
    **model_kwargs: Any,
):
    """(wrapped model, optimizer, scheduler, inner module) for one mode, from the same seeded model."""
    group = group if group is not None else ctx.group
    module = make_model(**model_kwargs)
    if mode == "ddp":
        model: nn.Module = DistributedDataParallel(module, process_group=group)
        opt: torch.optim.Optimizer = torch.optim.AdamW(param_groups(module), **ADAMW)
    else:
        overlap = mode in ("overlap", "zero1", "zero1_sync_gather")
        config = OverlapConfig(
            bucket_elements=bucket_elements,
            overlap_grad_reduce=overlap,
            overlap_param_gather=mode == "zero1",
            overwrite_first_grad=overwrite,
        )
        model = OverlapDataParallel(module, config, process_group=group)
        if mode.startswith("zero1"):
            opt = DistributedAdamW(model, param_groups(module), **ADAMW)
        else:
            opt = torch.optim.AdamW(param_groups(module), **ADAMW)
    return model, opt, make_scheduler(opt), module


def bf16_model(mixed: bool) -> ToyNet:
    module = make_model(dtype=torch.bfloat16)
    if mixed:  # an fp32 head on a bf16 body: two buffers, one per parameter dtype
        module.head.float()
    return module


@contextlib.contextmanager
def patched(owner: Any, name: str, value: Any):
    original = getattr(owner, name)
    setattr(owner, name, value)
    try:
        yield
    finally:
        setattr(owner, name, original)
