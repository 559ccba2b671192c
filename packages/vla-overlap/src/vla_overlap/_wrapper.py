"""OverlapDataParallel: the module wrapper that owns the buffers, the gradient hooks and the step's state."""

from __future__ import annotations

import enum
import weakref
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from ._broadcast import broadcast_module_states
from ._comm import CommStream, Communicator
from ._config import OverlapConfig
from ._grad_buckets import GradBuckets, accumulate_into
from ._grad_in_bucket import SECOND_GRADIENT, route_linears, unroute_linears
from ._hooks import current_autograd_node, weak_call
from ._layout import Layout, plan_layout
from ._param_gather import ParamGather
from ._shard_grad import placeholders
from ._sync import OverlapGradSync
from ._used import UsedFlags


class _Phase(enum.Enum):
    ACCUMULATING = "accumulating"  # after zero_grad_buffer(): gradients may arrive
    LAUNCHED = "launched"  # every bucket's collective has been launched
    FINISHED = "finished"  # every collective was waited for; gradients are final for this step


class OverlapDataParallel(nn.Module):
    """Data-parallel wrapper that reduces gradients bucket by bucket while backward is still running.

    Trainable parameters (``requires_grad``) are laid out, per dtype, in contiguous gradient buffers in
    reverse registration order, cut into buckets. A post-accumulate hook adds each gradient into its
    ``param.main_grad`` view (fp32 by default) and drops ``param.grad``; on the last microbatch (outside
    ``no_sync()``) a bucket's reduction is launched as soon as its last gradient arrived, and the end of
    that backward pass waits for all of them. Without a sharded optimizer the averaged gradients are
    then exposed as ``param.grad``, so any torch optimizer works. Call ``zero_grad()`` (or
    ``zero_grad_buffer()``) before each step's first backward.
    """

    def __init__(
        self,
        module: nn.Module,
        config: OverlapConfig | None = None,
        *,
        process_group: dist.ProcessGroup | None = None,
    ) -> None:
        super().__init__()
        self.module = module
        self.config = config if config is not None else OverlapConfig()
        self._comm = Communicator(process_group)
        named = [(name, p) for name, p in module.named_parameters() if p.requires_grad]
        if not named:
            raise ValueError("the module has no trainable parameters (requires_grad=True) to synchronize")
        devices = {p.device for _, p in named}
        if len(devices) > 1:
            raise ValueError(
                f"all trainable parameters must be on one device, found {sorted(map(str, devices))}"
            )
        self._device = devices.pop()
        if self.config.sync_module_states and self._comm.size > 1:
            broadcast_module_states(module, self._comm)
        self.layout: Layout = plan_layout(
            [(name, p.dtype, p.numel()) for name, p in named],
            world_size=self._comm.size,
            bucket_elements=self.config.bucket_elements,
            grad_dtype=self.config.grad_reduce_dtype,
        )
        by_name = dict(named)
        self._params = [by_name[slot.name] for slot in self.layout.slots]  # slot order (backward order)
        self._slot_of = {id(p): i for i, p in enumerate(self._params)}
        self._stream = CommStream(self._device)
        self._grads = GradBuckets(
            self.layout,
            [p.shape for p in self._params],
            self._device,
            self._comm,
            self._stream,
            self.config.reduce_dtype,
        )
        for param, main_grad in zip(self._params, self._grads.main_grads):
            param.main_grad = main_grad  # the accumulation target, also for callers that bypass hooks
        self._gather: ParamGather | None = None
        self._sharded_optimizer: Any = None
        self._last_microbatch = True
        self._finish_in_backward = True  # False inside launch_in_backward()
        self._seen = [False] * len(self._params)
        self._used = (
            UsedFlags(self._comm, self._stream, self._device) if self.config.allow_unused_params else None
        )
        self._unused: frozenset[int] = frozenset()  # slots no rank used this step: .grad stays None
        self._in_place: frozenset[int] = frozenset()  # slots whose Linear's GEMM writes the buffer itself
        self._placeholders: list[torch.Tensor] = []  # the .grad of each parameter under ZeRO-1
        self._hooks_fired = False
        self._callback_queued = False
        self._phase = _Phase.ACCUMULATING
        self._handles = [
            p.register_post_accumulate_grad_hook(self._make_grad_hook(i)) for i, p in enumerate(self._params)
        ]
        self.grad_sync = OverlapGradSync(self)
        """This wrapper's gradient sync as one `GradSync` object, for step runners (e.g. vla_graph.GraphedStep)."""

    # ----------------------------------------------------------------------------------------- public API
    @property
    def process_group(self) -> dist.ProcessGroup:
        return self._comm.group

    @property
    def world_size(self) -> int:
        return self._comm.size

    @property
    def rank(self) -> int:
        return self._comm.rank

    def trainable_parameters(self) -> list[nn.Parameter]:
        """The bucketed parameters, in registration order."""
        return self._params[::-1]

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        return self.module(*args, **kwargs)

    def train(self, mode: bool = True) -> OverlapDataParallel:
        """Also behind `eval()`: finishes pending parameter gathers first (`finish_param_sync()`, a collective
        when gathers are pending), so parameters read after switching modes are current."""
        self.finish_param_sync()
        return super().train(mode)

    @contextmanager
    def no_sync(self) -> Iterator[None]:
        """Backward passes inside only accumulate (gradient accumulation); the next one outside reduces."""
        previous, self._last_microbatch = self._last_microbatch, False
        try:
            yield
        finally:
            self._last_microbatch = previous

    @contextmanager
    def launch_in_backward(self) -> Iterator[None]:
        """A backward pass inside launches each bucket's collective as soon as its gradients are complete,
        as the last microbatch does, but does not wait for them when it ends: call `finish_grad_sync()`
        yourself. For capturing the last microbatch and the sync in one CUDA graph (vla_graph's
        `sync_in_graph`): the wait must then run on the capturing thread and stream, inside the capture."""
        previous = (self._last_microbatch, self._finish_in_backward)
        self._last_microbatch, self._finish_in_backward = True, False
        try:
            yield
        finally:
            self._last_microbatch, self._finish_in_backward = previous

    def mark_grads_synced(self) -> None:
        """The buffers already hold this step's reduced gradients because a replayed CUDA graph ran the
        collectives (hooks and Python do not run at replay): finish the step's bookkeeping as
        `finish_grad_sync()` would, without communicating. Call it after each such replay."""
        if self._phase is _Phase.FINISHED:
            return
        self._grads.mark_all_done()
        if self._used is not None:
            self._used.wait()  # launched by a start_grad_sync() on every rank: done; a replay used everything
        self._phase = _Phase.FINISHED
        self._expose_grads()

    def write_weight_grads_in_place(self) -> int:
        """While this wrapper lives, each nn.Linear whose trainable weight has a buffer of its dtype writes its
        weight gradient there, not for the hook to copy (contract: `_grad_in_bucket`). Returns the count."""
        targets = {id(p): g for p, g in zip(self._params, self._grads.main_grads)}
        routed = route_linears(self.module, targets, accumulate=not self.config.overwrite_first_grad)
        self._in_place = frozenset(self._slot_of[id(linear.weight)] for linear in routed)
        weakref.finalize(self, unroute_linears, [(m, m._grad_bucket_view) for m in routed])  # then plain
        return len(routed)

    def zero_grad_buffer(self) -> None:
        """Start a new step: zero the gradient buffers and forget which gradients arrived."""
        self._grads.reset(zero=not self.config.overwrite_first_grad)
        self._seen = [False] * len(self._params)
        self._unused = frozenset()
        self._hooks_fired = False
        self._callback_queued = False
        self._phase = _Phase.ACCUMULATING
        for param in self._params:
            param.grad = None

    def zero_grad(self, set_to_none: bool = True) -> None:
        """Same as `zero_grad_buffer()` (the buffers are the gradients; `set_to_none` is accepted for
        compatibility with nn.Module.zero_grad)."""
        self.zero_grad_buffer()

    def start_grad_sync(self) -> None:
        """Launch every bucket not launched yet, in order. Gradients may have reached the buffers through
        the hooks, through ``param.main_grad`` directly (e.g. replayed CUDA graphs, where hooks do not fire)
        or as ``param.grad`` (folded in here). Idempotent within a step."""
        if self._phase is not _Phase.ACCUMULATING:
            return
        self._fold_param_grads()
        self._zero_unseen()  # a bucket holding one is not complete, so not launched yet
        self.finish_param_sync()  # see _on_grad
        self._grads.launch_all()
        if self._used is not None:
            self._used.launch(self._seen)
        self._phase = _Phase.LAUNCHED
        # Checked after launching, so that the other ranks' collectives still complete if this one raises.
        if self._hooks_fired and not self.config.allow_unused_params:
            self._check_every_param_got_a_gradient()

    def finish_grad_sync(self) -> None:
        """Wait for every bucket's collective (launching what is left first). Afterwards the buffers hold
        the mean gradient over ranks (only this rank's shard is valid when a sharded optimizer is attached)
        and, without one, ``param.grad`` is set. Idempotent within a step; called automatically at the end of
        the last microbatch's backward."""
        if self._phase is _Phase.FINISHED:
            return
        self.start_grad_sync()
        self._grads.wait_all()
        if self._used is not None:
            self._unused = self._used.wait()
        self._phase = _Phase.FINISHED
        self._expose_grads()

    def _expose_grads(self) -> None:
        """Without a sharded optimizer, the reduced buffers become `param.grad` (any torch optimizer); with
        one, a placeholder that raises when used (each rank holds only a shard). Parameters that no rank
        used keep `.grad` None, as under torch DDP, so optimizers skip them."""
        if self._sharded_optimizer is None:
            for param, main_grad in zip(self._params, self._grads.main_grads):
                param.grad = main_grad if main_grad.dtype == param.dtype else main_grad.to(param.dtype)
        else:
            for param, placeholder in zip(self._params, self._placeholders):
                param.grad = placeholder
        for slot in self._unused:
            self._params[slot].grad = None

    @property
    def unused_slots(self) -> frozenset[int]:
        """Slots (indices into `layout.slots`) of the parameters no rank used this step, known once the
        gradients are synchronized; always empty unless `allow_unused_params`."""
        return self._unused

    def finish_param_sync(self) -> None:
        """With a sharded optimizer and `overlap_param_gather`: make every parameter hold the gathered values
        of the last step. Parameters are otherwise gathered by the next forward pass: call this (on every
        rank: it is a collective while gathers are pending) before reading them some other way. The state
        dicts of the model and the optimizer, `eval()` and `train()` call it for you."""
        if self._gather is not None and self._gather.pending:
            self._gather.finish()

    def clip_grad_norm_(self, max_norm: float, norm_type: float = 2.0) -> torch.Tensor:
        """Clip the synchronized gradients to a global norm (over all ranks' shards when sharded)."""
        if self._sharded_optimizer is not None:
            return self._sharded_optimizer.clip_grad_norm_(max_norm, norm_type)
        self.finish_grad_sync()
        return torch.nn.utils.clip_grad_norm_(self.trainable_parameters(), max_norm, norm_type)

    # ------------------------------------------------------------------------------------ gradient hooks
    def _make_grad_hook(self, slot: int) -> Any:
        # Hooks live on the parameters, out of the garbage collector's sight: a strong reference back to
        # the wrapper would keep it, its buffers and the model alive after the last user reference is gone.
        wrapper = weakref.ref(self)

        def hook(param: torch.Tensor) -> None:
            owner = wrapper()
            if owner is not None:
                owner._on_grad(slot, param)

        return hook

    def _on_grad(self, slot: int, param: torch.Tensor) -> None:
        name = self.layout.slots[slot].name
        if self._phase is not _Phase.ACCUMULATING:
            raise RuntimeError(
                f"gradient for {name!r} arrived after this step's gradient sync started. Call "
                "zero_grad() (or zero_grad_buffer()) before the first backward of each step, and run every "
                "backward of a step but the last one inside no_sync()."
            )
        if self._grads.is_launched(slot):
            raise RuntimeError(
                f"a second gradient for {name!r} arrived after its bucket's reduction was launched "
                "(several backward passes in the last microbatch?): run all but the last inside no_sync()."
            )
        self._accumulate(slot, param.grad)
        param.grad = None
        self._hooks_fired = True
        if self._last_microbatch:
            # Forward pre-hooks dispatch gathers only for the modules a rank ran (and one ahead): a module
            # that ran on some ranks only leaves the others with fewer gathers. Finishing them before the
            # step's first gradient collective keeps every rank's sequence of collectives the same.
            self.finish_param_sync()
            if self._finish_in_backward and not self._callback_queued:
                self._callback_queued = True
                self._queue_backward_end()
            self._grads.mark_ready(slot, launch=self.config.overlap_grad_reduce)

    def _queue_backward_end(self) -> None:
        torch.autograd.Variable._execution_engine.queue_callback(self._on_backward_end)

    def _on_backward_end(self) -> None:
        outer = current_autograd_node()
        if outer is not None:
            # A nested backward (reentrant activation checkpointing) ended inside an outer one: the
            # step's gradients are complete only when the outer backward ends, so hand over to it.
            outer.register_hook(lambda *_: self._queue_backward_end())
            return
        self._callback_queued = False
        self.finish_grad_sync()

    def _fold_param_grads(self) -> None:
        for slot, param in enumerate(self._params):
            if param.grad is None:
                continue
            if self._grads.is_launched(slot):
                raise RuntimeError(
                    f"{self.layout.slots[slot].name!r} has a .grad but its bucket was already reduced"
                )
            self._accumulate(slot, param.grad)
            param.grad = None

    def _accumulate(self, slot: int, grad: torch.Tensor) -> None:
        """Add a gradient into its buffer; the step's first one is copied when buffers are not zeroed."""
        first = not self._seen[slot] and self.config.overwrite_first_grad
        if slot not in self._in_place:
            accumulate_into(self._grads.main_grads[slot], grad, first)
        elif self._seen[slot] and self.config.overwrite_first_grad:  # the GEMM overwrote the first one
            raise RuntimeError(SECOND_GRADIENT.format(name=self.layout.slots[slot].name))
        self._seen[slot] = True

    def _zero_unseen(self) -> None:
        """Buffers not zeroed at the step's start hold the last step's values until a gradient arrives:
        clear those of parameters that got none this step before they are reduced. Only when gradients
        arrived through Python this step: after a replayed CUDA graph nothing did, and the buffers hold what
        the graph's captured copies and adds wrote."""
        if self.config.overwrite_first_grad and any(self._seen):
            for slot, seen in enumerate(self._seen):
                if not seen:
                    self._grads.main_grads[slot].zero_()

    def _check_every_param_got_a_gradient(self) -> None:
        missing = [self.layout.slots[i].name for i, seen in enumerate(self._seen) if not seen]
        if missing:
            shown = ", ".join(repr(n) for n in missing[:10]) + (" ..." if len(missing) > 10 else "")
            raise RuntimeError(
                f"{len(missing)} trainable parameter(s) received no gradient this step: {shown}. Freeze them "
                "(requires_grad=False) before wrapping, or pass OverlapConfig(allow_unused_params=True) if "
                "they are legitimately unused in some steps."
            )

    # ------------------------------------------------------------------------------- sharded optimizer side
    def _attach_sharded_optimizer(self, optimizer: Any) -> ParamGather:
        """Switch to reduce-scatter and move parameters into gatherable buffers (called by DistributedAdamW)."""
        if self._sharded_optimizer is not None:
            raise RuntimeError("a sharded optimizer is already attached to this OverlapDataParallel")
        if self._hooks_fired or self._phase is not _Phase.ACCUMULATING:
            raise RuntimeError("create the sharded optimizer before the first backward pass")
        self._sharded_optimizer = optimizer
        self._grads.sharded = True
        self._placeholders = placeholders(self._params, [slot.name for slot in self.layout.slots])
        self._gather = ParamGather(self.layout, self._params, self._device, self._comm, self._stream)
        if self.config.overlap_param_gather:
            self._register_gather_pre_hooks()
        # Reading or loading parameters through (sub)module state dicts must not race pending gathers, and
        # parameters loaded in place make the optimizer's fp32 master weights stale.
        for module in {self.module, *(m for m, _ in self._modules_with_params())}:
            module.register_state_dict_pre_hook(weak_call(self, "finish_param_sync"))
            module.register_load_state_dict_pre_hook(weak_call(self, "finish_param_sync"))
            module.register_load_state_dict_post_hook(weak_call(optimizer, "mark_params_changed"))
        return self._gather

    def _start_param_gather(self) -> None:
        """Every shard was updated: gather now, or leave it to the forward pre-hooks."""
        assert self._gather is not None
        self._gather.start()
        if not self.config.overlap_param_gather:
            self._gather.finish()

    def _modules_with_params(self) -> Iterator[tuple[nn.Module, list[int]]]:
        """Every submodule that directly owns trainable parameters, with their buckets in forward order."""
        for module in self.module.modules():
            own = {self._slot_of[id(p)] for p in module.parameters(recurse=False) if id(p) in self._slot_of}
            if own:
                yield module, sorted({self.layout.slots[i].bucket for i in own}, reverse=True)

    def _register_gather_pre_hooks(self) -> None:
        for module, buckets in self._modules_with_params():
            module.register_forward_pre_hook(self._make_gather_hook(buckets))

    def _make_gather_hook(self, buckets: list[int]) -> Any:
        wrapper = weakref.ref(self)  # see _make_grad_hook

        def hook(module: nn.Module, args: Any) -> None:
            owner = wrapper()
            gather = owner._gather if owner is not None else None
            if gather is not None and gather.pending:
                for bucket in buckets:
                    gather.ensure(bucket)

        return hook
