"""Probe: the weight-gradient GEMMs of routed Linears (vla_overlap `write_weight_grads_in_place`) on a side
stream, beside the backward's input-gradient GEMMs and small kernels, joined at the end of each backward.

Inductor must not hand a buffer the side-stream GEMM still reads to a later kernel of the same compiled graph:
its buffer reuse and in-place buffers are off for the blocks, donated backward buffers are off, and the
tensors the GEMMs read are held until the join (so the caching allocator cannot hand them out either).
"""

from __future__ import annotations

import torch
import torch._functorch.config as functorch_config
from vla_overlap import _grad_in_bucket

_STATE: dict = {"stream": None, "held": []}


@torch.library.custom_op("vla_probe::weight_grad_beside", mutates_args=("out",))
def weight_grad_beside(out: torch.Tensor, grad_out: torch.Tensor, x: torch.Tensor, accumulate: bool) -> None:
    main = torch.cuda.current_stream()
    if _STATE["stream"] is None:
        _STATE["stream"] = torch.cuda.Stream()
    side = _STATE["stream"]
    side.wait_stream(main)
    with torch.cuda.stream(side):
        torch.ops.vla_overlap.weight_grad_into(out, grad_out, x, accumulate)  # the same GEMM, on `side`
    _STATE["held"].append((grad_out, x))


@weight_grad_beside.register_fake
def _(out, grad_out, x, accumulate) -> None:
    return None


def _backward(ctx, grad_out):  # _LinearGradInBucket.backward with its weight-gradient op swapped
    x, weight, bucket_view = ctx.saved_tensors
    grad_x = grad_out.matmul(weight) if ctx.needs_input_grad[0] else None
    torch.ops.vla_probe.weight_grad_beside(bucket_view, grad_out, x, ctx.accumulate)
    grad_bias = grad_out.reshape(-1, grad_out.shape[-1]).sum(0) if ctx.has_bias else None
    return grad_x, torch.empty_like(weight), grad_bias, None, None


def join() -> None:
    if _STATE["stream"] is not None:
        torch.cuda.current_stream().wait_stream(_STATE["stream"])
    if _STATE["held"] and not _STATE.get("said"):
        _STATE["said"] = True
        print(f"wgrad stream: {len(_STATE['held'])} weight-gradient GEMMs beside", flush=True)
    _STATE["held"].clear()


def no_reuse(trainer) -> None:
    functorch_config.donated_buffer = False


def wgrad_stream(trainer) -> None:
    no_reuse(trainer)
    torch._dynamo.reset()  # blocks compiled by an earlier row would keep the old backward
    _grad_in_bucket._LinearGradInBucket.backward = staticmethod(_backward)
    graphed = trainer.model.graphed_step
    inner = graphed._step_fn

    def step_fn(batch):
        loss = inner(batch)
        join()
        return loss

    graphed._step_fn = step_fn
