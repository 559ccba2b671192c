"""Worker scenarios of test_deferred.py: the deferred process group (results only on wait) and the order
of gradient arrivals and collective launches."""

from __future__ import annotations

import contextlib
from typing import Any

import torch
import torch.nn.functional as F
from _workers_common import batch, build, make_model, params_of, patched, run_steps
from vla_overlap import OverlapConfig, OverlapDataParallel


def deferred_vs_gloo(ctx: Any, break_what: str | None = None) -> dict[str, Any]:
    """Every overlapped mode on the deferred group (results only on wait) and on plain gloo.
    `break_what` sabotages one wait, to prove the deferred group catches it."""
    from vla_overlap import _grad_buckets, _param_gather

    out: dict[str, Any] = {}
    patches = contextlib.ExitStack()
    if break_what == "grad_wait":  # drop the waits of the gradient collectives
        patches.enter_context(patched(_grad_buckets.GradBuckets, "wait_all", lambda self: None))
    if break_what == "gather_wait":  # pre-hooks dispatch but never wait

        def ensure(self, bucket):  # noqa: ANN001, ANN202
            while self._next <= self._position[bucket]:
                self._dispatch_next()

        patches.enter_context(patched(_param_gather.ParamGather, "ensure", ensure))
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
