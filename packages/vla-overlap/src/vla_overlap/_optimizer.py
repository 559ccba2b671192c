"""DistributedAdamW: ZeRO-1 over an OverlapDataParallel's buffers."""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from ._flat_adamw import FlatAdamW, flat_supported
from ._moments8_state import encoded_state_dict, load_state_dict8, moments_in_state
from ._param_groups import user_groups as _user_groups
from ._state import gather_state_dict, scatter_state_dict
from ._update_stream import UpdateStream
from ._wrapper import OverlapDataParallel

_OWN_MASTERS = (torch.float32, torch.float64)
"""Parameter dtypes stepped in place (their own master weights); others get fp32 master copies."""


class DistributedAdamW(torch.optim.Optimizer):
    """AdamW whose fp32 master weights and moments exist only for this rank's shard of every bucket.

    Gradients are reduce-scattered (each rank receives the mean gradient of its shard), the shard is
    stepped by a torch AdamW (fused on CUDA unless told otherwise), written back into the parameter
    buffer (cast to bf16/fp16 where the parameters are), then all-gathered: lazily by forward pre-hooks
    when ``OverlapConfig.overlap_param_gather`` is on, else at the end of ``step()``.

    ``param_groups`` are the inner AdamW's groups (over shard pieces), so LR schedulers work as usual.
    fp32 parameters are their own master copy (their shard of the parameter buffer is stepped in place).
    float64 parameters too (fp64 master weights and moments). Frozen parameters in ``params`` are skipped,
    as torch optimizers skip parameters without a gradient; so are parameters that no rank used in a step
    (``OverlapConfig.allow_unused_params``), as under torch DDP.
    ``flat="auto"`` (unless foreach or unfused is asked for; on CUDA with Triton) steps each bucket's shard in one
    pass that also applies the clipping and writes the bf16 copy (FlatAdamW); "torch" runs that arithmetic
    in torch ops, None keeps torch's AdamW. ``remainders=True`` (with the flat step) keeps the fp32 masters of
    bf16 parameters as the parameter plus a 16-bit remainder while stepping (_remainders: 26 bytes moved per
    parameter and step instead of 28; a master at an exact rounding tie moves one fp32 ulp); state dicts
    still hold the fp32 masters. ``moments="int8"`` (with the flat step; "auto" then falls back to "torch"
    off CUDA) keeps both moments as 8-bit codes with one fp32 scale per 64 elements (_moments8: 2.125 bytes
    per element instead of 8); state dicts hold them decoded, in fp32 (_moments8_state), unless asked for as stored.
    """

    def __init__(
        self,
        model: OverlapDataParallel,
        params: Iterable[nn.Parameter] | Iterable[dict[str, Any]] | None = None,
        lr: float | torch.Tensor = 1e-3,
        betas: tuple[float, float] = (0.9, 0.999),
        eps: float = 1e-8,
        weight_decay: float = 1e-2,
        *,
        amsgrad: bool = False,
        fused: bool | None = None,
        foreach: bool | None = None,
        flat: str | None = None,
        remainders: bool = False,
        moments: str = "fp32",
    ) -> None:
        if flat not in ("auto", "triton", "torch", None):
            raise ValueError(f"flat must be 'auto', 'triton', 'torch' or None, got {flat!r}")
        if moments not in ("fp32", "int8"):
            raise ValueError(f"moments must be 'fp32' or 'int8', got {moments!r}")
        if not isinstance(model, OverlapDataParallel):
            raise TypeError(
                f"DistributedAdamW needs an OverlapDataParallel model, got {type(model).__name__}"
            )
        user_groups = _user_groups(model, params)
        gather = model._attach_sharded_optimizer(self)
        self._model = model
        self._comm = model._comm
        self.group_slots = [[model._slot_of[id(p)] for p in g["params"]] for g in user_groups]
        layout = model.layout
        self.masters: list[torch.Tensor] = []
        self._grad_shards: list[torch.Tensor] = []
        for bucket in range(len(layout.buckets)):
            shard = gather.shard_view(bucket)
            master = shard if shard.dtype in _OWN_MASTERS else shard.float()
            self.masters.append(master)
            # the model's buffer, read in place; a copy in the masters' dtype only without the flat step
            # (_widen_grad_shards)
            self._grad_shards.append(model._grads.shard_view(bucket))
        # Every rank all-reduces its partial norm in this dtype, whichever buffers its own pieces sit in.
        self._norm_dtype = (
            torch.float64 if torch.float64 in {m.dtype for m in self.masters} else torch.float32
        )
        group_of = {slot: g for g, slots in enumerate(self.group_slots) for slot in slots}
        piece_groups = [{k: v for k, v in g.items() if k != "params"} | {"params": []} for g in user_groups]
        self.pieces: list[tuple[int, Any, torch.Tensor]] = []  # (bucket, ShardPiece, master view)
        self._shards_are_pieces = True  # every piece of every shard is stepped: a shard's norm is theirs
        for bucket in range(len(layout.buckets)):
            for piece in layout.pieces(bucket, model.rank):
                if piece.slot not in group_of:
                    self._shards_are_pieces = False
                    continue
                master = self.masters[bucket][piece.shard_start : piece.shard_start + piece.numel]
                piece_groups[group_of[piece.slot]]["params"].append(master)
                self.pieces.append((bucket, piece, master))
        # Norms are summed in the optimizer's parameter order, as torch.nn.utils.clip_grad_norm_ over its
        # param_groups does, whatever buckets and dtype buffers the pieces sit in: the clipping coefficient
        # does not depend on the layout, and at one rank it equals torch's bit for bit.
        position = {slot: i for i, slot in enumerate(s for slots in self.group_slots for s in slots)}
        self._norm_order = sorted(
            range(len(self.pieces)),
            key=lambda i: (position[self.pieces[i][1].slot], self.pieces[i][1].param_start),
        )
        if fused is None and foreach is None and model._device.type == "cuda":
            fused = True
        self.inner = torch.optim.AdamW(
            piece_groups,
            lr=lr,
            betas=betas,
            eps=eps,
            weight_decay=weight_decay,
            amsgrad=amsgrad,
            fused=fused,
            foreach=foreach,
        )
        self._groups_fixed = False
        super().__init__([{"params": []}], dict(self.inner.defaults))
        self._groups_fixed = True
        self._share_inner_groups()
        self._grads_ready = False
        self._masters_stale = False
        self._clip_coef: torch.Tensor | None = None
        # "auto" leaves an explicit foreach or unfused choice alone
        self.flat = self._make_flat(
            None if flat == "auto" and (foreach or fused is False) else flat, remainders, moments
        )
        for asked, what in ((remainders, "remainders=True"), (moments == "int8", "moments='int8'")):
            if asked and self.flat is None:
                raise ValueError(f"DistributedAdamW({what}) needs the flat step (flat='triton' or 'torch')")
        self.moments = moments
        if self.flat is None:
            self._widen_grad_shards()
        self._piece_grads = [  # what clipping reads; with torch's AdamW also the pieces' .grad
            self._grad_shards[bucket][piece.shard_start : piece.shard_start + piece.numel]
            for bucket, piece, _ in self.pieces
        ]
        if self.flat is None:
            for (_, _, master), grad in zip(self.pieces, self._piece_grads):
                master.grad = grad

    @property
    def masters_in_order(self) -> list[torch.Tensor]:
        """This rank's fp32 master pieces in the optimizer's parameter order (its groups as given; param_groups
        follow the buckets): the order of `state_dict()["state"]` and of the gradient norm's sum."""
        return [self.pieces[i][2] for i in self._norm_order]

    def track_rows(self, param: nn.Parameter, touched: torch.Tensor) -> bool:
        """Let the flat step skip the rows of `param` (along dim 0) that never had a gradient, as in an
        embedding or per-category table of which a run uses a few rows. `touched` (bool, one entry per row, on
        the parameter's device) is the caller's record: set True, before the step, for every row whose gradient
        may be nonzero (in every rank's batch: at world size > 1, OR it across ranks first), never cleared. The
        other rows must get exactly zero gradients. The result is that of stepping them: AdamW moves a row with
        zero gradient and zero moments by weight decay alone. Returns whether the rows are tracked (only with
        the flat step, and for rows of a multiple of 64 elements)."""
        slot = self._model._slot_of.get(id(param))
        if slot is None or not any(slot in slots for slots in self.group_slots):
            raise ValueError(
                f"track_rows: a tensor of shape {tuple(param.shape)} is not a parameter this optimizer steps"
            )
        if (
            touched.dtype != torch.bool
            or tuple(touched.shape) != (param.shape[0],)
            or touched.device != param.device
        ):
            raise ValueError(
                f"track_rows: touched must be a bool tensor of shape ({param.shape[0]},) on {param.device}, got "
                f"{touched.dtype} {tuple(touched.shape)} on {touched.device}"
            )
        return self.flat is not None and self.flat.track_rows(slot, param.shape[0], touched)

    def stage_update(self, stages: Sequence[Sequence[nn.Parameter]], updates: UpdateStream) -> bool:
        """Step the parameters in stages, in the order the forward first reads them: stage 0 is every
        parameter not in `stages`, stage k the parameters of `stages[k - 1]` (a shared one: the first stage
        listing it). The update marks `updates`' fence of each stage as it completes
        (`UpdateStream.wait_stage(k)` then waits for stages 0..k), with
        the same arithmetic as one pass. Only at one rank with the flat step (at more ranks, parameters
        arrive by a gather after the whole update); returns whether the update is staged."""
        if self.flat is None or self._comm.size != 1:
            return False
        stage_of_slot = {}
        for k, params in enumerate(stages, start=1):
            for p in params:
                if id(p) not in self._model._slot_of:
                    raise ValueError(
                        f"stage_update: a parameter of shape {tuple(p.shape)} is not stepped here"
                    )
                stage_of_slot.setdefault(self._model._slot_of[id(p)], k)  # shared: its first reader's stage
        updates.add_stages(len(stages) + 1)
        self.flat.set_stages(stage_of_slot, len(stages) + 1, updates.mark_stage)
        return True

    def _make_flat(self, flat: str | None, remainders: bool, moments: str) -> FlatAdamW | None:
        """The one-pass-per-bucket step (FlatAdamW) when asked for and possible; "auto": Triton on CUDA (else,
        with 8-bit moments, which only the flat step has, its torch form)."""
        if flat is None:
            return None
        kernel = "triton" if flat == "auto" else flat
        why_not = flat_supported(self, kernel)
        if why_not is not None and flat == "auto" and moments == "int8":
            kernel, why_not = "torch", flat_supported(self, "torch")
        if why_not is None:
            return FlatAdamW(self, kernel, remainders, moments)
        if flat != "auto":
            raise ValueError(f"DistributedAdamW(flat={flat!r}) cannot run: {why_not}")
        return None

    def _share_inner_groups(self) -> None:
        # One set of groups and state, the inner AdamW's: schedulers and inspection see the real thing.
        self.param_groups = self.inner.param_groups
        self.state = self.inner.state
        self.defaults = self.inner.defaults

    def add_param_group(self, param_group: dict[str, Any]) -> None:
        if getattr(self, "_groups_fixed", False):
            raise NotImplementedError("DistributedAdamW's parameter groups are fixed at construction")
        super().add_param_group(param_group)

    def mark_params_changed(self) -> None:
        """The parameters were changed outside this optimizer (the module's `load_state_dict` calls this for
        you): the fp32 master weights are re-read from them before they are next used."""
        self._masters_stale = True

    def _refresh_masters(self) -> None:
        if self._masters_stale:
            for bucket, master in enumerate(self.masters):
                shard = self._model._gather.shard_view(bucket)
                if master is not shard:
                    master.copy_(shard)
            if self.flat is not None:
                self.flat.masters_from_params()
            self._masters_stale = False

    def _widen_grad_shards(self) -> None:
        """torch's AdamW steps each master with a `.grad` of its own dtype: shards whose gradient buffer is
        narrower (bf16 gradients of fp32 masters, fp32 ones of fp64 masters) get a copy in the masters' dtype,
        filled each step by `_prepare_grads`. The flat step needs none: it and its norm read the buffers in
        place and widen as they load (exact), which saves the copy's memory and its pass."""
        for bucket, master in enumerate(self.masters):
            if self._grad_shards[bucket].dtype != master.dtype:
                self._grad_shards[bucket] = torch.zeros_like(master)

    def zero_grad(self, set_to_none: bool = True) -> None:
        """Start a new step: zeroes the model's gradient buffers."""
        self._model.zero_grad_buffer()
        self._grads_ready = False

    def _prepare_grads(self) -> list[torch.Tensor]:
        """Finish the reduce-scatter and expose this rank's mean gradient, in the masters' dtype, as the
        pieces' grads."""
        if not self._grads_ready:
            self._model.finish_grad_sync()
            for bucket, target in enumerate(self._grad_shards):
                source = self._model._grads.shard_view(bucket)
                if target.data_ptr() != source.data_ptr():  # a widened copy (_widen_grad_shards)
                    target.copy_(source)
            self._grads_ready = True
        return self._piece_grads

    @torch.no_grad()
    def clip_grad_norm_(self, max_norm: float, norm_type: float = 2.0) -> torch.Tensor:
        """Scale this step's gradients so that their global norm (over every rank's shard) is at most
        `max_norm`, like torch.nn.utils.clip_grad_norm_; returns the norm before clipping."""
        grads = self._prepare_grads()
        device = self._grad_shards[0].device
        norm_type = float(norm_type)
        dtype = self._norm_dtype
        if norm_type == math.inf:
            local = (
                torch.stack([g.abs().max().to(dtype) for g in grads]).max()
                if grads
                else torch.zeros((), dtype=dtype, device=device)
            )
            self._comm.all_reduce_now(local, dist.ReduceOp.MAX)
            total = local
        else:
            local = torch.zeros((), dtype=dtype, device=device)
            if grads and self.flat is not None and self._shards_are_pieces:
                # One reduction per bucket shard instead of one per piece (3.6 -> ~1.5 ms over n1.6-3b's
                # 1.6 B gradients on an H200); padding and unused pieces are zero. The sum runs in another
                # order than torch's, so the norm agrees to fp32 rounding, as the flat step itself does.
                local = self.flat.grad_norm(norm_type).to(dtype)
            elif grads:
                ordered = [grads[i] for i in self._norm_order]
                if all(g.element_size() >= 4 for g in ordered):
                    norms = torch._foreach_norm(ordered, norm_type)
                else:  # bf16 gradients read in place: their norms in fp32
                    norms = [torch.linalg.vector_norm(g, norm_type, dtype=torch.float32) for g in ordered]
                if dtype == torch.float64:  # fp32 and fp64 pieces: one dtype to stack
                    norms = [n.to(dtype) for n in norms]
                local = torch.linalg.vector_norm(torch.stack(norms), norm_type)
            powered = local**norm_type
            self._comm.all_reduce_now(powered)
            total = powered ** (1.0 / norm_type)
        coef = torch.clamp(max_norm / (total + 1e-6), max=1.0)
        if self.flat is not None:
            self._clip_coef = coef  # applied as the step reads each gradient
        elif self.inner.defaults.get("fused"):
            # The fused kernel divides each gradient by grad_scale as it reads it: clipping costs no pass over
            # the gradients (GradScaler's hook; cleared after the step).
            self.inner.grad_scale = (1.0 / coef).float()  # the kernels read a float32 scale
        elif grads:
            torch._foreach_mul_(grads, coef)
        return total

    @torch.no_grad()
    def step(self, closure: Callable[[], float] | None = None) -> None:  # type: ignore[override]
        """Finish the gradient reduce-scatter, step the local shard, write it back and gather parameters."""
        if closure is not None:
            raise ValueError("DistributedAdamW.step does not take a closure")
        self._model.finish_param_sync()  # no gather may still be writing into the parameter buffer
        self._refresh_masters()
        self._prepare_grads()
        unused = self._model.unused_slots  # no rank used them: not stepped, as torch DDP + AdamW would not
        skipped = [i for i, (_, piece, _) in enumerate(self.pieces) if piece.slot in unused] if unused else []
        if self.flat is not None:
            coef, self._clip_coef = self._clip_coef, None
            self.flat.step(coef, skipped)  # writes the bf16 parameter copy in the same pass
        else:
            masters = [self.pieces[i][2] for i in skipped]
            grads = [master.grad for master in masters]
            for master in masters:
                master.grad = None  # torch's AdamW skips a parameter without a gradient
            try:
                self.inner.step()
            finally:
                self.inner.grad_scale = None
                for master, grad in zip(masters, grads):
                    master.grad = grad
            self._write_back()
        self._grads_ready = False
        self._model._start_param_gather()

    def _write_back(self) -> None:
        gather = self._model._gather
        for bucket, master in enumerate(self.masters):
            shard = gather.shard_view(bucket)
            if master is not shard:
                shard.copy_(master)

    def state_dict(
        self, *, on_device: bool = False, keep: Callable | None = None, encoded_moments: bool = False
    ) -> dict[str, Any]:
        """Full, unsharded state keyed by parameter name (a collective: every rank must call it; every rank
        gets the same result, on CPU). Loadable at any world size and bucket size. `on_device` / `keep`:
        the entries left on the device, or what `keep` makes of each (see _state.gather_state_dict).
        `encoded_moments` (8-bit moments, any world size): each moment as stored, its codes and block scales
        (at more ranks gathered so), for `decode_moments` later (_moments8_state.encoded_state_dict); otherwise,
        and before the first step, they are decoded here."""
        self._model.finish_param_sync()
        self._refresh_masters()
        if self.flat is not None:
            self.flat.sync_masters()
            self.flat.write_steps()
            if encoded_moments and self.moments == "int8":
                state = encoded_state_dict(self, on_device=on_device, keep=keep)
                if state is not None:
                    return state
            if self.moments == "int8":  # decoded one bucket at a time, onto the host: moments are CPU tensors
                with moments_in_state(self.flat):
                    return gather_state_dict(self, on_device=on_device, keep=keep)
        return gather_state_dict(self, on_device=on_device, keep=keep)

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Load a `state_dict()` saved at any world size; also sets the parameters to the saved fp32 master
        weights (a collective: every rank must call it)."""
        self._model.finish_param_sync()
        if self.moments == "int8":
            load_state_dict8(self, state_dict)  # encoded bucket by bucket, never all in fp32 on the device
        else:
            scatter_state_dict(self, state_dict)
        self._masters_stale = False  # the saved masters are exact; they win over bf16 parameters
        self._share_inner_groups()  # the inner load_state_dict replaced its group list
        if self.flat is not None:
            self.flat.relink()  # loaded moments into the flat buffers, and the step counts
            self.flat.encode_masters()
        self._write_back()
        self._model._start_param_gather()
        self._model.finish_param_sync()
