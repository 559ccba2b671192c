"""Scenarios run inside the pool's worker processes: tiny models, a global batch split over ranks, and the
training loops of torch DDP + AdamW (the reference) and of every vla_overlap mode."""

from __future__ import annotations

import contextlib
import dataclasses
import os
import time
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


MODES = ("ddp", "overlap", "allreduce_after_backward", "zero1", "zero1_sync_gather", "zero1_nooverlap")


def compare_modes(
    ctx: Any, steps: int = 3, micro: int = 2, autocast: bool = False, clip: float | None = None
):
    """Final parameters (and clip norms) of every mode after the same training."""
    out = {}
    for mode in MODES:
        model, opt, sched, module = build(ctx, mode)
        norms = run_steps(ctx, model, opt, sched, range(steps), micro, autocast=autocast, clip=clip)
        out[mode] = {"params": params_of(module), "norms": norms}
    return out


# ------------------------------------------------------------------------------------------- bf16 parameters
def _bf16_model(mixed: bool) -> ToyNet:
    module = make_model(dtype=torch.bfloat16)
    if mixed:  # an fp32 head on a bf16 body: two buffers, one per parameter dtype
        module.head.float()
    return module


def bf16_master_weights(ctx: Any, steps: int = 3, micro: int = 2, mixed: bool = False) -> dict[str, Any]:
    """bf16 parameters (or bf16 + fp32 with `mixed`, under bf16 autocast): DistributedAdamW vs a
    hand-written fp32-master reference (fp32 gradient accumulation, mean over ranks, AdamW on fp32
    masters, cast back to the parameter dtype)."""
    out = {}
    for gather_overlap in (True, False):
        module = _bf16_model(mixed)
        config = OverlapConfig(bucket_elements=600, overlap_param_gather=gather_overlap)
        model = OverlapDataParallel(module, config, process_group=ctx.group)
        assert len(model.layout.buffers) == (2 if mixed else 1)
        opt = DistributedAdamW(model, **ADAMW)
        run_steps(
            ctx, model, opt, make_scheduler(opt), range(steps), micro, autocast=mixed, dtype=torch.bfloat16
        )
        out[f"zero1_gather_overlap={gather_overlap}"] = params_of(module)

    module = _bf16_model(mixed)
    trainable = [p for p in module.parameters() if p.requires_grad]
    masters = [p.detach().float().clone() for p in trainable]
    opt = torch.optim.AdamW(masters, **ADAMW)
    sched = make_scheduler(opt)
    for step in range(steps):
        acc = [torch.zeros_like(m) for m in masters]
        for m in range(micro):
            x, y = batch(step, m, ctx.rank, ctx.world_size, torch.bfloat16)
            with torch.autocast("cpu", dtype=torch.bfloat16) if mixed else contextlib.nullcontext():
                out_ = module(x)
            (F.mse_loss(out_.float(), y.float()) / micro).backward()
            for a, p in zip(acc, trainable):
                a.add_(p.grad)
                p.grad = None
        for a, master in zip(acc, masters):
            a.mul_(1.0 / ctx.world_size)
            torch.distributed.all_reduce(a, group=ctx.group)
            master.grad = a
        opt.step()
        sched.step()
        with torch.no_grad():
            for p, master in zip(trainable, masters):
                p.copy_(master)
    out["reference"] = params_of(module)
    return out


# -------------------------------------------------------------------------------- deferred process group
def deferred_vs_gloo(ctx: Any, break_what: str | None = None) -> dict[str, Any]:
    """Every overlapped mode on the deferred group (results only on wait) and on plain gloo.
    `break_what` sabotages one wait, to prove the deferred group catches it."""
    from vla_overlap import _grad_buckets, _param_gather

    out: dict[str, Any] = {}
    patches = contextlib.ExitStack()
    if break_what == "grad_wait":  # drop the waits of the gradient collectives
        patches.enter_context(_patched(_grad_buckets.GradBuckets, "wait_all", lambda self: None))
    if break_what == "gather_wait":  # pre-hooks dispatch but never wait

        def ensure(self, bucket):  # noqa: ANN001, ANN202
            while self._next <= self._position[bucket]:
                self._dispatch_next()

        patches.enter_context(_patched(_param_gather.ParamGather, "ensure", ensure))
    with patches:
        for mode in ("overlap", "zero1"):
            for name, group in (("deferred", ctx.deferred), ("gloo", ctx.group)):
                if break_what is not None and name == "gloo":
                    continue
                model, opt, sched, module = build(ctx, mode, group=group, shuffled=True)
                try:
                    run_steps(ctx, model, opt, sched, range(3), 2, autocast=True)
                    out[f"{mode}/{name}"] = params_of(module)
                except RuntimeError as error:
                    out[f"{mode}/{name}"] = f"error: {error}"
    return out


@contextlib.contextmanager
def _patched(owner: Any, name: str, value: Any):
    original = getattr(owner, name)
    setattr(owner, name, value)
    try:
        yield
    finally:
        setattr(owner, name, original)


def dispatch_log(ctx: Any, overlap: bool, micro: int = 3) -> dict[str, Any]:
    """Interleaving of gradient arrivals and collective launches over two steps, from the deferred
    group's log and a second post-accumulate hook registered after the wrapper's."""
    module = make_model()
    model = OverlapDataParallel(
        module, OverlapConfig(bucket_elements=600, overlap_grad_reduce=overlap), process_group=ctx.deferred
    )
    events: list[tuple] = []
    log = ctx.deferred.log
    bucket_ptr = {model._grads.bucket_view(b).data_ptr(): b for b in range(len(model.layout.buckets))}
    slot_of = {id(p): i for i, p in enumerate(model._params)}

    def flush() -> None:
        while log:
            op, ptr, _ = log.pop(0)
            events.append((op, bucket_ptr.get(ptr, -1)))

    def record(param: torch.Tensor) -> None:
        flush()
        events.append(("grad", slot_of[id(param)]))

    for p in model._params:
        p.register_post_accumulate_grad_hook(record)
    log.clear()
    for step in range(2):
        model.zero_grad()
        events.append(("step", step))
        for m in range(micro):
            events.append(("micro", m))
            x, y = batch(step, m, ctx.rank, ctx.world_size)
            with contextlib.nullcontext() if m == micro - 1 else model.no_sync():
                F.mse_loss(model(x), y).backward()
            flush()
            events.append(("backward_done", m))
    bucket_slots = [list(b.slots) for b in model.layout.buckets]
    return {"events": events, "bucket_slots": bucket_slots}


# ------------------------------------------------------------------------------------------- explicit path
def explicit_path(ctx: Any, sharded: bool) -> dict[str, Any]:
    """Gradients that reach the buffers without hooks (written into main_grad, or set as .grad) and are
    reduced by start/finish_grad_sync, vs the hook path."""
    out = {}
    for how in ("hooks", "main_grad", "dot_grad"):
        mode = "zero1" if sharded else "overlap"
        # Code that adds into main_grad itself needs buffers zeroed at each step's start.
        model, opt, sched, module = build(ctx, mode, overwrite=how != "main_grad")
        params = model.trainable_parameters()
        for step in range(3):
            model.zero_grad()
            total = None
            for m in range(2):
                x, y = batch(step, m, ctx.rank, ctx.world_size)
                loss = F.mse_loss(model(x), y) / 2
                if how == "hooks":
                    with contextlib.nullcontext() if m == 1 else model.no_sync():
                        loss.backward()
                    continue
                grads = torch.autograd.grad(loss, params)  # no AccumulateGrad: hooks do not fire
                if how == "main_grad":
                    for p, g in zip(params, grads):
                        p.main_grad.add_(g)
                else:
                    total = list(grads) if total is None else [t + g for t, g in zip(total, grads)]
            if how == "dot_grad":
                for p, g in zip(params, total):
                    p.grad = g
            if how != "hooks":
                model.start_grad_sync()
                model.finish_grad_sync()
            opt.step()
            sched.step()
        out[how] = params_of(module)
    return out


def launched_in_backward(ctx: Any, sharded: bool) -> dict[str, Any]:
    """The last microbatch under launch_in_backward() with an explicit finish, and gradients reduced outside
    the wrapper then recorded with mark_grads_synced() (what a replayed CUDA graph leaves behind), vs hooks."""
    import torch.distributed as dist

    out: dict[str, Any] = {"states": []}
    for how in ("hooks", "launch_then_finish", "reduced_elsewhere"):
        model, opt, sched, module = build(ctx, "zero1" if sharded else "overlap")
        for step in range(3):
            model.zero_grad()
            for m in range(2):
                x, y = batch(step, m, ctx.rank, ctx.world_size)
                loss = F.mse_loss(model(x), y) / 2
                if m == 0 or how == "reduced_elsewhere":
                    context = model.no_sync()
                else:
                    context = contextlib.nullcontext() if how == "hooks" else model.launch_in_backward()
                with context:
                    loss.backward()
            if how == "launch_then_finish":  # every bucket launched from backward, nothing waited yet
                out["states"].append((model._grads.all_launched, model._phase.value != "finished"))
                model.finish_grad_sync()
            elif how == "reduced_elsewhere":
                grads = model._grads  # the buckets' collectives, issued by someone else
                for bucket in range(len(model.layout.buckets)):
                    view = grads.bucket_view(bucket).mul_(1.0 / ctx.world_size)
                    if sharded:  # into the shard buffer the optimizer reads
                        dist.reduce_scatter_tensor(
                            grads.shard_view(bucket), view.clone(), group=model.process_group
                        )
                    else:
                        dist.all_reduce(view, group=model.process_group)

                def refuse(*_: Any) -> None:
                    raise AssertionError("mark_grads_synced communicated")

                with (
                    _patched(model._comm, "all_reduce", refuse),
                    _patched(model._comm, "reduce_scatter", refuse),
                ):
                    model.mark_grads_synced()
                    norm = clip_grad_norm(model, opt, 1e9)  # sees the step as synchronized
                out["states"].append(("norm", float(norm) > 0))
            opt.step()
            sched.step()
        out[how] = params_of(module)
    return out


# ------------------------------------------------------------------------------------------ unused params
def unused_params(ctx: Any, allow: bool, skip_rank: int) -> dict[str, Any]:
    """A parameter unused on rank `skip_rank` (-1: used everywhere; 99: unused everywhere)."""
    use_extra = skip_rank not in (ctx.rank, 99)
    module = make_model(unused=True)
    module.use_extra = use_extra
    config = OverlapConfig(bucket_elements=600, allow_unused_params=allow)
    model = OverlapDataParallel(module, config, process_group=ctx.group)
    opt = torch.optim.AdamW(model.trainable_parameters(), **ADAMW)
    try:
        run_steps(ctx, model, opt, make_scheduler(opt), range(2), 2)
    except RuntimeError as error:
        return {"error": str(error)}
    ref_module = make_model(unused=True)
    ref_module.use_extra = use_extra
    ref = DistributedDataParallel(ref_module, process_group=ctx.group, find_unused_parameters=True)
    ref_opt = torch.optim.AdamW([p for p in ref_module.parameters() if p.requires_grad], **ADAMW)
    run_steps(ctx, ref, ref_opt, make_scheduler(ref_opt), range(2), 2)
    return {"ours": params_of(module), "ddp": params_of(ref_module)}


# ------------------------------------------------------------------------------------------- checkpoints
def checkpoint_save(ctx: Any, save_at: int, steps: int, micro: int = 2) -> dict[str, Any]:
    """Train zero1 for `steps` steps, taking model + optimizer + scheduler state after `save_at`."""
    model, opt, sched, module = build(ctx, "zero1")
    run_steps(ctx, model, opt, sched, range(save_at), micro)
    saved = {"model": params_of(module), "optim": opt.state_dict(), "sched": sched.state_dict()}
    run_steps(ctx, model, opt, sched, range(save_at, steps), micro)
    return {"saved": saved, "final": params_of(module)}


def checkpoint_resume(
    ctx: Any, saved: dict[str, Any], start: int, steps: int, micro: int = 2
) -> dict[str, Any]:
    """Fresh (differently seeded) zero1 run that loads `saved` and continues; also re-saves right after
    loading to prove the round trip is lossless."""
    module = make_model(seed=123)
    model = OverlapDataParallel(module, OverlapConfig(bucket_elements=600), process_group=ctx.group)
    opt = DistributedAdamW(model, param_groups(module), **ADAMW)
    sched = make_scheduler(opt)
    module.load_state_dict(saved["model"])
    opt.load_state_dict(saved["optim"])
    sched.load_state_dict(saved["sched"])
    resaved = opt.state_dict()
    run_steps(ctx, model, opt, sched, range(start, steps), micro)
    return {"resaved": resaved, "final": params_of(module), "lr": opt.param_groups[0]["lr"]}


# ---------------------------------------------------------------------------------------- misuse errors
def misuse_errors(ctx: Any) -> dict[str, str]:
    """Each misuse, run on a fresh wrapper, and the message it raised (or 'no error')."""

    def attempt(fn: Any) -> str:
        try:
            fn()
        except (RuntimeError, ValueError, TypeError, NotImplementedError) as error:
            return f"{type(error).__name__}: {error}"
        return "no error"

    def fresh(**config: Any) -> tuple[OverlapDataParallel, nn.Module]:
        module = make_model()
        return OverlapDataParallel(
            module, OverlapConfig(bucket_elements=600, **config), process_group=ctx.group
        ), module

    x, y = batch(0, 0, ctx.rank, ctx.world_size)
    out = {}

    def backward_twice_without_zero() -> None:
        model, _ = fresh()
        model.zero_grad()
        F.mse_loss(model(x), y).backward()
        F.mse_loss(model(x), y).backward()

    out["backward_after_sync"] = attempt(backward_twice_without_zero)

    def second_gradient_after_launch() -> None:
        # embed runs once plainly and once inside a reentrant checkpoint: its gradient arrives twice in one
        # backward, the second time after its bucket (complete after the first) was launched.
        module = make_model()
        module.requires_grad_(False)
        module.embed.requires_grad_(True)
        model = OverlapDataParallel(module, OverlapConfig(bucket_elements=1), process_group=ctx.group)
        model.zero_grad()
        h = module.embed(x)
        h = checkpoint(module.embed, h[:, :D_IN], use_reentrant=True)
        h.sum().backward()

    out["second_gradient"] = attempt(second_gradient_after_launch)

    def frozen_param_in_optimizer() -> None:
        model, module = fresh()
        DistributedAdamW(model, [module.frozen.weight])

    out["frozen_in_optimizer"] = attempt(frozen_param_in_optimizer)

    def two_sharded_optimizers() -> None:
        model, _ = fresh()
        DistributedAdamW(model)
        DistributedAdamW(model)

    out["two_optimizers"] = attempt(two_sharded_optimizers)

    def add_group() -> None:
        model, module = fresh()
        DistributedAdamW(model, [module.head.weight]).add_param_group({"params": [module.head.bias]})

    out["add_param_group"] = attempt(add_group)

    def optimizer_on_plain_module() -> None:
        DistributedAdamW(make_model())  # type: ignore[arg-type]

    out["not_wrapped"] = attempt(optimizer_on_plain_module)

    def load_foreign_state() -> None:
        model, module = fresh()
        opt = DistributedAdamW(model, [module.head.weight])
        opt.load_state_dict(torch.optim.AdamW([module.head.weight]).state_dict())

    out["foreign_state"] = attempt(load_foreign_state)

    def load_other_params() -> None:
        model, module = fresh()
        saved = DistributedAdamW(model, [module.head.weight]).state_dict()
        other, other_module = fresh()
        DistributedAdamW(other, [other_module.head.bias]).load_state_dict(saved)

    out["other_params"] = attempt(load_other_params)

    def everything_frozen() -> None:
        module = make_model()
        module.requires_grad_(False)
        OverlapDataParallel(module, process_group=ctx.group)

    out["nothing_trainable"] = attempt(everything_frozen)
    return out


def gather_and_clip_agree(ctx: Any) -> dict[str, Any]:
    """Global grad norm: DistributedAdamW's sharded computation vs torch's on the full DDP gradients."""
    ours, opt, _, _ = build(ctx, "zero1")
    ref, ref_opt, _, ref_module = build(ctx, "ddp")
    for model in (ours, ref):
        model.zero_grad()
        x, y = batch(0, 0, ctx.rank, ctx.world_size)
        F.mse_loss(model(x), y).backward()
    ref_norm = torch.nn.utils.clip_grad_norm_([p for p in ref_module.parameters() if p.requires_grad], 1e9)
    inf_norm = opt.clip_grad_norm_(1e9, float("inf"))
    ref_inf = max(p.grad.abs().max() for p in ref_module.parameters() if p.requires_grad)
    two_norm = opt.clip_grad_norm_(1e9)  # idempotent grads: a second clip sees the same gradients
    return {
        "ours": float(two_norm),
        "ref": float(ref_norm),
        "ours_inf": float(inf_norm),
        "ref_inf": float(ref_inf),
    }


def reentrant_checkpoint(ctx: Any) -> dict[str, Any]:
    """Blocks under reentrant activation checkpointing (nested backward passes) vs DDP without it."""
    out = {}
    for mode in ("ddp", "overlap", "zero1"):
        model, opt, sched, module = build(ctx, mode, checkpointed=mode != "ddp")
        run_steps(ctx, model, opt, sched, range(2), 2)
        out[mode] = params_of(module)
    return out


def compare_build_modes(ctx: Any) -> dict[str, Any]:
    """Every COMM_MODES entry built by name, with clipping through the uniform helper."""
    out = {}
    for mode in COMM_MODES:
        module = make_model()
        config = OverlapConfig(bucket_elements=600)
        adamw = {k: v for k, v in ADAMW.items()}
        model, opt = build_comm_mode(module, mode, config=config, process_group=ctx.group, **adamw)
        norms = run_steps(ctx, model, opt, make_scheduler(opt), range(3), 2, clip=0.05)
        out[mode] = {"params": params_of(module), "norms": norms}
    return out


class Scalars(nn.Module):
    """Seven one-element parameters whose gradients are exactly the given constants."""

    def __init__(self, grads: list[float]) -> None:
        super().__init__()
        self.weights = nn.ParameterList(nn.Parameter(torch.zeros(1)) for _ in grads)
        self.register_buffer("grads", torch.tensor(grads))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return sum(w * g for w, g in zip(self.weights, self.grads)) + 0 * x.sum()


def clip_norm_order(ctx: Any) -> dict[str, float]:
    """The global norm each mode's clip reports for gradients [1, b, b, b, b, b, b] with b = 0.875 * 2**-12:
    summed in registration order (torch) the six b**2 vanish one by one next to 1 (the total is 1.0); summed
    the other way round they add up to two ulps of 1 first (the total is 1 + 2**-23). Exact in float32 on
    any CPU: seven values stay in the scalar tail of every vectorized norm kernel, and every square is exact."""
    grads = [1.0] + [0.875 * 2.0**-12] * 6
    out = {}
    for mode in COMM_MODES:
        model, opt = build_comm_mode(Scalars(grads), mode, process_group=ctx.group, **ADAMW)
        model.zero_grad()
        model(torch.zeros(1)).backward()
        out[mode] = float(clip_grad_norm(model, opt, max_norm=10.0))
    return out


def warnings_during_training(ctx: Any) -> list[str]:
    """Every warning raised while training zero1 with an LR scheduler (deprecated collective names, a
    scheduler that believes optimizer.step() was skipped, ...)."""
    import warnings

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for mode in ("overlap", "zero1"):
            model, opt, sched, module = build(ctx, mode)
            run_steps(ctx, model, opt, sched, range(2), 2, clip=1.0)
            if mode == "zero1":
                opt.state_dict()
    return [f"{w.category.__name__}: {w.message}" for w in caught]


def load_weights_into_running_zero1(ctx: Any) -> dict[str, bool]:
    """bf16 parameters, lazy gathers pending after a step, then module.load_state_dict(new weights): the
    loaded values must survive state_dict reads, a forward pass and an lr=0 step (stale fp32 masters or
    late gathers would bring the old weights back)."""
    module = make_model(dtype=torch.bfloat16)
    model = OverlapDataParallel(module, OverlapConfig(bucket_elements=600), process_group=ctx.group)
    opt = DistributedAdamW(model, **ADAMW)
    run_steps(ctx, model, opt, make_scheduler(opt), range(1), 2, dtype=torch.bfloat16)
    assert model._gather.pending, "the scenario needs gathers still pending"
    weights = params_of(make_model(seed=7, dtype=torch.bfloat16))
    module.load_state_dict(weights)
    checks = {"after_load": all(torch.equal(v, weights[k]) for k, v in params_of(module).items())}
    x, y = batch(5, 0, ctx.rank, ctx.world_size, torch.bfloat16)
    model(x)
    checks["after_forward"] = all(torch.equal(v, weights[k]) for k, v in params_of(module).items())
    for group in opt.param_groups:
        group["lr"], group["weight_decay"] = 0.0, 0.0
    model.zero_grad()
    F.mse_loss(model(x).float(), y.float()).backward()
    opt.step()
    checks["after_step"] = all(torch.equal(v, weights[k]) for k, v in params_of(module).items())
    return checks


def broadcast_on_wrap(ctx: Any) -> dict[str, Any]:
    """Ranks start from different weights (and a module buffer); wrapping makes them rank 0's."""
    module = make_model(seed=ctx.rank)
    module.register_buffer("running", torch.full((3,), float(ctx.rank)))
    before = params_of(module)
    OverlapDataParallel(module, OverlapConfig(), process_group=ctx.group)
    return {"before": before, "after": params_of(module)}


def hang_the_first_time(ctx: Any, marker: str) -> int:
    """Rank 0 sleeps far past any deadline unless `marker` exists (it creates it): a hung first attempt."""
    if ctx.rank == 0 and not os.path.exists(marker):
        open(marker, "w").close()
        time.sleep(3600)
    return ctx.rank


# ------------------------------------------------------------------------------------------- fused clipping
def fused_clip(ctx: Any, steps: int = 3, micro: int = 2) -> dict[str, Any]:
    """DistributedAdamW with global-norm clipping: fused AdamW (the clip folded into its grad_scale, no pass
    over the gradients) vs the single-tensor AdamW (gradients multiplied by the clip coefficient)."""
    out = {}
    for fused in (False, True):
        module = make_model()
        model = OverlapDataParallel(module, OverlapConfig(bucket_elements=600), process_group=ctx.group)
        opt = DistributedAdamW(model, param_groups(module), **{**ADAMW, "foreach": None, "fused": fused})
        norms = run_steps(ctx, model, opt, make_scheduler(opt), range(steps), micro, clip=0.05)
        out[f"fused={fused}"] = {
            "params": params_of(module),
            "norms": norms,
            "scale_left": opt.inner.grad_scale,
        }
    return out


def flat_adamw(ctx: Any, steps: int = 3, micro: int = 2) -> dict[str, Any]:
    """DistributedAdamW's flat one-pass step (torch-op kernel here; the Triton kernel is tested on the GPU)
    vs torch's AdamW, with clipping and two parameter groups, bf16 parameters with fp32 masters; then the
    flat optimizer's state dict loaded into a torch-stepped one continues the same trajectory."""
    out = {}
    for flat in (None, "torch"):
        module = _bf16_model(mixed=True)
        model = OverlapDataParallel(module, OverlapConfig(bucket_elements=600), process_group=ctx.group)
        opt = DistributedAdamW(model, param_groups(module), **{**ADAMW, "flat": flat})
        sched = make_scheduler(opt)
        norms = run_steps(
            ctx, model, opt, sched, range(steps), micro, autocast=True, clip=0.05, dtype=torch.bfloat16
        )
        saved = opt.state_dict()
        resumed_module = _bf16_model(mixed=True)
        resumed = OverlapDataParallel(
            resumed_module, OverlapConfig(bucket_elements=600), process_group=ctx.group
        )
        other = DistributedAdamW(
            resumed, param_groups(resumed_module), **{**ADAMW, "flat": "torch" if flat is None else None}
        )
        other.load_state_dict(saved)
        other_sched = make_scheduler(other)
        for _ in range(steps):
            other_sched.step()
        run_steps(
            ctx,
            resumed,
            other,
            other_sched,
            range(steps, steps + 2),
            micro,
            autocast=True,
            clip=0.05,
            dtype=torch.bfloat16,
        )
        out[f"flat={flat}"] = {
            "params": params_of(module),
            "norms": norms,
            "resumed": params_of(resumed_module),
            "masters": {name: entry["master"] for name, entry in saved["state"].items()},
            "moments": {name: entry["exp_avg_sq"] for name, entry in saved["state"].items()},
            "steps": [float(entry["step"]) for entry in saved["state"].values()],
        }
    # The flat moments exist from the first step on (as torch's AdamW state does), and a state dict saved
    # before any step, loaded into a stepped optimizer, leaves them zero (a fresh start).
    fresh_module = _bf16_model(mixed=True)
    fresh_model = OverlapDataParallel(
        fresh_module, OverlapConfig(bucket_elements=600), process_group=ctx.group
    )
    fresh = DistributedAdamW(fresh_model, param_groups(fresh_module), **{**ADAMW, "flat": "torch"})
    out["lazy_moments"] = all(
        flat[key] is None for flat in fresh.flat.buckets for key in ("exp_avg", "exp_avg_sq")
    )
    out["state_before_step"] = sorted({key for state in fresh.state.values() for key in state})
    opt.load_state_dict(fresh.state_dict())  # opt: the flat one, stepped above
    out["moments_after_fresh_load"] = [
        float(flat[key].abs().sum()) for flat in opt.flat.buckets for key in ("exp_avg", "exp_avg_sq")
    ]
    return out


def replayed_buffers(ctx: Any) -> dict[str, Any]:
    """What a replayed CUDA graph leaves: gradients written into the buffers with no hook firing (Python did
    not run), then the eager sync. The buffers are not zeroed at the step's start (overwrite_first_grad),
    and the sync must not mistake them for stale values."""
    module = make_model()
    model = OverlapDataParallel(module, OverlapConfig(bucket_elements=600), process_group=ctx.group)
    params = model.trainable_parameters()
    x, y = batch(0, 0, ctx.rank, ctx.world_size)
    F.mse_loss(model(x), y).backward()  # one ordinary step first, so the buffers hold old values
    model.zero_grad_buffer()
    written = []
    for index, p in enumerate(params):
        value = torch.full_like(p.main_grad, float(index + 1 + ctx.rank))
        p.main_grad.copy_(value)
        written.append(value)
    model.start_grad_sync()
    model.finish_grad_sync()
    mean = [w - ctx.rank + (ctx.world_size - 1) / 2 for w in written]
    return {"ok": all(torch.equal(p.main_grad, m) for p, m in zip(params, mean))}


def bf16_wire(ctx: Any, sharded: bool) -> dict[str, Any]:
    """Gradients accumulated in fp32 and reduced in bf16 (OverlapConfig.reduce_dtype): what each rank gets
    vs the mean computed the way the wire computes it (each rank's 1/world-scaled fp32 bucket rounded to
    bf16, summed in bf16), from every rank's known gradients."""
    module = make_model()
    config = OverlapConfig(bucket_elements=600, reduce_dtype=torch.bfloat16, overwrite_first_grad=False)
    model = OverlapDataParallel(module, config, process_group=ctx.group)
    if sharded:
        DistributedAdamW(model, **ADAMW)
    params = model.trainable_parameters()

    def grads_of(rank: int) -> list[torch.Tensor]:
        gen = torch.Generator().manual_seed(100 + rank)
        return [torch.randn(p.shape, generator=gen) for p in params]

    model.zero_grad_buffer()
    for p, g in zip(params, grads_of(ctx.rank)):
        p.main_grad.add_(g)
    model.start_grad_sync()
    model.finish_grad_sync()
    assert all(w is None or w.dtype == torch.bfloat16 for w in model._grads.wire)
    total = None
    for rank in range(ctx.world_size):
        scaled = [(g * (1.0 / ctx.world_size)).bfloat16() for g in grads_of(rank)]
        total = (
            scaled if total is None else [(t.float() + s.float()).bfloat16() for t, s in zip(total, scaled)]
        )
    expected = [t.float() for t in total]
    layout = model.layout
    ok = True
    for p, want in zip(params, expected):
        if sharded:  # only this rank's shard of each bucket is reduced, into the shard buffer
            where = layout.slots[model._slot_of[id(p)]]
            lo, hi = layout.buckets[where.bucket].shard_range(ctx.rank, ctx.world_size)
            first, last = max(lo, where.start), min(hi, where.start + where.numel)
            if first >= last:
                continue
            got = model._grads.shard_view(where.bucket)[first - lo : last - lo]
            ok &= torch.equal(got, want.reshape(-1)[first - where.start : last - where.start])
        else:
            ok &= torch.equal(p.main_grad, want)
    return {"ok": bool(ok)}


# ---------------------------------------------------------------------------- edge cases (issue 14, item 8)
EDGE_STEPS = 5


def _edge_uses_branch(step: int, rank: int) -> bool:
    """The optional branch: rank 0 only at steps 0 and 1 (moments start; with gathers pending at 1), nobody
    at 2 and 4, everyone at 3."""
    return (step < 2 and rank == 0) or step == 3


def _edge_module(dtype: torch.dtype = torch.float32) -> ToyNet:
    """ToyNet with a branch used in some steps and a layer never used at all."""
    module = make_model(unused=True)
    module.dead = nn.Linear(D_OUT, D_OUT)  # registered last: the first slot of the layout
    return module.to(dtype)


def _edge_build(
    ctx: Any, mode: str, module: nn.Module, params: Any = None, find_unused: bool = False, **config: Any
):
    """DDP + torch AdamW, or one of our modes with allow_unused_params."""
    params = param_groups(module) if params is None else params
    if mode == "ddp":
        model = DistributedDataParallel(module, process_group=ctx.group, find_unused_parameters=find_unused)
        return model, torch.optim.AdamW(params, **ADAMW)
    config = OverlapConfig(
        bucket_elements=config.pop("bucket_elements", 600),
        overlap_grad_reduce=mode != "allreduce_after_backward",
        overlap_param_gather=mode != "zero1_sync_gather",
        allow_unused_params=True,
        **config,
    )
    model = OverlapDataParallel(module, config, process_group=ctx.group)
    if mode.startswith("zero1"):
        flat = "torch" if mode == "zero1_flat" else None
        return model, DistributedAdamW(model, params, **{**ADAMW, "flat": flat})
    return model, torch.optim.AdamW(params, **ADAMW)


def unused_everywhere(ctx: Any, bucket_elements: int = 600, micro: int = 2) -> dict[str, Any]:
    """Parameters no rank used in a step (and one never used) vs DDP, whose AdamW skips them (grad None).
    bucket_elements=1, micro=1: every parameter in a bucket of its own and one forward per step, so the lazy
    gathers of the buckets after the branch are dispatched before backward on the ranks that run it only."""
    out = {}
    for mode in ("ddp", "overlap", "allreduce_after_backward", "zero1", "zero1_sync_gather", "zero1_flat"):
        module = _edge_module()
        model, opt = _edge_build(ctx, mode, module, find_unused=True, bucket_elements=bucket_elements)
        grads_none = []
        for step in range(EDGE_STEPS):
            module.use_extra = _edge_uses_branch(step, ctx.rank)
            model.zero_grad()
            for m in range(micro):
                x, y = batch(step, m, ctx.rank, ctx.world_size)
                with contextlib.nullcontext() if m == micro - 1 else model.no_sync():
                    (F.mse_loss(model(x), y) / micro).backward()
            grads_none.append([module.unused.weight.grad is None, module.dead.weight.grad is None])
            opt.step()
        if isinstance(opt, DistributedAdamW):
            # through a state dict round trip: the step counts a fresh optimizer read back (flat: per piece)
            fresh_module = _edge_module()
            _, fresh_opt = _edge_build(ctx, mode, fresh_module, bucket_elements=bucket_elements)
            fresh_opt.load_state_dict(opt.state_dict())
            saved = fresh_opt.state_dict()["state"]
            steps = {name: float(entry["step"]) for name, entry in saved.items() if "step" in entry}
        else:
            names = {id(p): name for name, p in module.named_parameters()}
            steps = {names[id(p)]: float(entry["step"]) for p, entry in opt.state.items()}
        out[mode] = {"params": params_of(module), "grads_none": grads_none, "steps": steps}
    return out


def frozen_in_optimizer_params(ctx: Any) -> dict[str, Any]:
    """Parameter groups that include frozen parameters (as module.parameters() does): torch's AdamW skips
    them; DistributedAdamW must too."""
    out = {}
    for mode in ("ddp", "zero1", "zero1_flat"):
        module = make_model()
        named = list(module.named_parameters())  # frozen.weight / frozen.bias included
        groups = [
            {"params": [p for n, p in named if p.dim() >= 2]},
            {"params": [p for n, p in named if p.dim() < 2], "weight_decay": 0.0, "lr": 2e-2},
        ]
        model, opt = _edge_build(ctx, mode, module, params=groups)
        run_steps(ctx, model, opt, make_scheduler(opt), range(3), 2)
        out[mode] = {"params": params_of(module)}
        if mode != "ddp":
            out[mode]["saved"] = sorted(opt.state_dict()["state"])
    return out


def torch_clip_under_zero1(ctx: Any) -> dict[str, Any]:
    """torch.nn.utils.clip_grad_norm_ on a ZeRO-1 model (each rank holds a shard of the gradients)."""
    module = make_model()
    model, opt = _edge_build(ctx, "zero1", module)
    out: dict[str, Any] = {}
    for step in range(2):
        model.zero_grad()
        out[f"none_after_zero_grad_{step}"] = all(p.grad is None for p in module.parameters())
        x, y = batch(step, 0, ctx.rank, ctx.world_size)
        F.mse_loss(model(x), y).backward()
        try:
            norm = torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            out[f"torch_clip_{step}"] = f"no error, returned {float(norm)}"
        except RuntimeError as error:
            out[f"torch_clip_{step}"] = str(error)
        out[f"ours_{step}"] = float(clip_grad_norm(model, opt, 1.0))  # still works
        opt.step()
    try:  # a backward after the step's sync, without zero_grad()
        F.mse_loss(model(x), y).backward()
        out["late_backward"] = "no error"
    except RuntimeError as error:
        out["late_backward"] = str(error)
    return out


def reads_after_step(ctx: Any, how: str) -> dict[str, Any]:
    """Parameters read right after step() with the lazy (forward pre-hook) gathers still pending, through
    `how`; and what they hold once every gather finished."""
    module = make_model(dtype=torch.bfloat16)
    model, opt = _edge_build(ctx, "zero1", module)
    run_steps(ctx, model, opt, make_scheduler(opt), range(1), 2, dtype=torch.bfloat16)
    assert model._gather.pending, "the scenario needs gathers still pending"
    if how == "eval":
        model.eval()
        seen = {n: p.detach().clone() for n, p in module.named_parameters()}
    elif how == "wrapper_state_dict":
        seen = {n.removeprefix("module."): t.clone() for n, t in model.state_dict().items()}
    elif how == "module_state_dict":
        seen = params_of(module)
    elif how == "optimizer_state_dict":
        opt.state_dict()
        seen = {n: p.detach().clone() for n, p in module.named_parameters()}
    else:
        assert how == "finish_param_sync"
        model.finish_param_sync()
        seen = {n: p.detach().clone() for n, p in module.named_parameters()}
    model.finish_param_sync()
    fresh = {n: p.detach().clone() for n, p in module.named_parameters()}
    return {"stale": sorted(n for n in fresh if not torch.equal(seen[n], fresh[n]))}


def float64_params(ctx: Any) -> dict[str, Any]:
    """float64 parameters: DDP + torch AdamW (fp64 all along) vs DistributedAdamW with fp64 gradient buffers
    (grad_reduce_dtype=None) and with the default fp32 ones."""
    out: dict[str, Any] = {}
    for mode in ("ddp", "zero1", "zero1_fp32_grads"):
        module = make_model(dtype=torch.float64)
        grad_dtype = torch.float32 if mode == "zero1_fp32_grads" else None
        extra = {} if mode == "ddp" else {"grad_reduce_dtype": grad_dtype}
        model, opt = _edge_build(ctx, "zero1" if mode != "ddp" else "ddp", module, **extra)
        norms = run_steps(ctx, model, opt, make_scheduler(opt), range(3), 2, dtype=torch.float64, clip=1e9)
        out[mode] = {"params": params_of(module), "norms": norms}
        if mode != "ddp":
            saved = opt.state_dict()["state"]
            out[mode]["dtypes"] = sorted(
                {
                    str(entry[key].dtype)
                    for entry in saved.values()
                    for key in ("master", "exp_avg", "exp_avg_sq")
                }
                | {str(m.dtype) for m in opt.masters}
            )
    try:
        module = make_model(dtype=torch.float64)
        _edge_build(ctx, "zero1_flat", module, grad_reduce_dtype=None)
        out["flat"] = "no error"
    except ValueError as error:
        out["flat"] = str(error)
    return out


def unused_flags_without_python_gradients(ctx: Any) -> dict[str, Any]:
    """allow_unused_params when no gradient went through Python (what a replayed CUDA graph leaves): written
    into main_grad then start/finish_grad_sync, or recorded with mark_grads_synced(). Nothing was "seen", so
    everything counts as used; one rank's eager step with the branch unused in between."""
    module = _edge_module()
    model, opt = _edge_build(ctx, "overlap", module)
    params = model.trainable_parameters()
    out: dict[str, Any] = {}
    for step, how in enumerate(("main_grad", "eager", "mark_grads_synced")):
        model.zero_grad()
        module.use_extra = False
        if how == "eager":
            x, y = batch(step, 0, ctx.rank, ctx.world_size)
            F.mse_loss(model(x), y).backward()
        else:
            for p in params:
                p.main_grad.fill_(1.0)
            if how == "main_grad":
                model.start_grad_sync()
                model.finish_grad_sync()
            else:
                model.mark_grads_synced()
        out[how] = sorted(n for n, p in module.named_parameters() if p.requires_grad and p.grad is None)
        opt.step()
    return out
