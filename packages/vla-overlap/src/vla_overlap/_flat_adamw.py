"""FlatAdamW: DistributedAdamW's step as one pass over each bucket's flat shard.

torch's fused AdamW walks the ~500 parameter views of n1.6-3b in chunks at about half an H200's memory
bandwidth; the bf16 copy of the parameters and the gradient clipping are two more passes. Here every
bucket's shard is contiguous (master weights, gradients, both moments), so one kernel per bucket reads the
gradient (scaled by the clipping coefficient on the fly), updates the moments and the fp32 master, and writes
the bf16 parameter copy in the same pass. Hyperparameters come from a small table of rows; each piece of a
parameter belongs to a row, and adjacent pieces of one row form a run. The kernel walks blocks of at most
BLOCK elements that never straddle two runs, so each block reads its row's hyperparameters once, as scalars
(per-element lookups made an earlier version of the kernel slower than torch's). Padding between parameters,
and pieces skipped in a step, belong to no run and stay untouched. A row is a parameter group at a step
count: pieces of parameters that no rank used in some step (allow_unused_params) lag behind their group's
count, so they get a row of their own (their own bias correction), as each parameter has its own step count
in torch's AdamW.

The moments stay visible as the inner torch AdamW's per-parameter state (views into the flat buffers), so
state dicts, schedulers and inspection work as before; 8-bit moments (moments="int8", _moments8) are codes and
scales of the buckets instead, decoded for state dicts (_moments8_state). `kernel="triton"` runs on CUDA; `kernel="torch"` is
the same arithmetic in torch ops (the reference the Triton kernel is tested against, and the CPU path of the
tests).
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

import torch

from ._block_plan import as_tuples, block_table, flag_index
from ._flat_adamw_steps import torch_step, triton_step
from ._moments8 import QBLOCK, allocate
from ._remainders import decode, encode_
from ._update_stages import split_by_stage

if TYPE_CHECKING:
    from ._optimizer import DistributedAdamW

MOMENTS = ("exp_avg", "exp_avg_sq")
BLOCK = 1024
"""Elements per block of the kernel (a block lies in one run). On an H200 over 1.62 B elements, with 4 warps:
1024 -> 11.7 ms, 2048 (8 warps) -> 12.6, 4096 -> 16.7, 8192 -> 43.6 (register spills)."""
ALIGN = 64
"""Blocks start and end at multiples of this many elements where the layout allows (its PARAM_ALIGN): the kernel
then moves 16 bytes per access instead of 4 (n1.6-3b's full step on an H200: 211.0 -> 212.5 samples/s)."""


def plan_blocks(runs: list[tuple[int, int, int]], length: int, block: int = BLOCK,
                cuts: list[int] = ()) -> tuple[list, int]:  # fmt: skip
    """The kernel's blocks (start, length, row) over `runs` of a shard of `length` elements, and the alignment
    the kernel may assume. When every run starts at a multiple of ALIGN, as the layout places parameters, and
    the shard's length is one too, each run is widened to the next multiple of ALIGN: the elements it gains are
    padding before the next parameter, zero in the master, gradient and moments, and an AdamW step keeps a zero
    at zero. Otherwise the blocks follow the runs exactly, at alignment 1. No block straddles a position of
    `cuts` (the row boundaries of tracked parameters, see FlatAdamW.track_rows). (block_table: the same as an
    array.)"""
    table, align = block_table(runs, length, block, ALIGN, cuts)
    return as_tuples(table), align


def flat_supported(opt: DistributedAdamW, kernel: str) -> str | None:
    """Why the flat step cannot run for this optimizer (None when it can)."""
    if any(master.dtype != torch.float32 for master in opt.masters):
        return "float64 parameters (it steps float32 master weights)"
    for group in opt.param_groups:
        for key in ("amsgrad", "maximize", "differentiable", "capturable"):
            if group.get(key):
                return f"{key}=True"
    if kernel == "triton":
        if not torch.cuda.is_available() or opt.masters[0].device.type != "cuda":
            return "the parameters are not on a CUDA device"
        try:
            import triton  # noqa: F401
        except ImportError:
            return "Triton is not installed"
    return None


class FlatAdamW:
    """The flat per-bucket AdamW step of a DistributedAdamW (see the module docstring)."""

    def __init__(
        self, opt: DistributedAdamW, kernel: str, remainders: bool = False, moments: str = "fp32"
    ) -> None:
        self.opt, self.kernel, self.moments = opt, kernel, moments  # moments: "fp32", or "int8" (_moments8)
        self.masters_behind = False  # remainders: the steps since the masters were last decoded
        gather = opt._model._gather
        self.buckets = []
        for bucket, master in enumerate(opt.masters):
            shard = gather.shard_view(bucket)
            self.buckets.append(
                {
                    "master": master,
                    "grad": opt._grad_shards[bucket],
                    # the moments, allocated at the first step as torch's AdamW does: not held through the
                    # first forward and backward, where compilation and graph capture peak
                    "exp_avg": None,
                    "exp_avg_sq": None,
                    # the bf16 parameters, written in the same pass (fp32 parameters are their own masters)
                    "out": None if shard.data_ptr() == master.data_ptr() else shard,
                    # with remainders, the master's low 16 bits (_remainders): the step reads and writes
                    # the bf16 parameter and these instead of the fp32 master
                    "rem": (
                        torch.zeros(master.numel(), dtype=torch.int16, device=master.device)
                        if remainders and shard.dtype == torch.bfloat16
                        else None
                    ),
                    "runs": [],  # (start, end, row) in the shard, ascending
                    "blocks": torch.zeros((0, 3), dtype=torch.int64, device=master.device),
                }
            )
        group_of = {id(p): g for g, group in enumerate(opt.param_groups) for p in group["params"]}
        self.group_of_piece = [group_of[id(master)] for _, _, master in opt.pieces]
        self.steps = [0] * len(opt.param_groups)  # per group
        self.lags = [0] * len(opt.pieces)  # steps each piece missed: its count is its group's minus this
        self.rows: list[tuple[int, int]] = []  # the table's rows, as (group, lag)
        self.labels: list[int | None] = [None] * len(opt.pieces)  # each piece's row now (None: skipped)
        self.padded: set[int] = set()  # pieces skipped by the last step
        self.tracks: list[dict[str, Any]] = []  # parameters whose untouched rows are idle (track_rows)
        self.kept = [flat for flat in self.buckets if flat["rem"] is not None]  # masters as remainders
        self.stage_of_slot: dict[int, int] = {}  # set_stages: the update in stages, a fence after each
        self.stage_count, self.on_stage = 1, None
        self.relink()
        if moments == "int8" and any(flat.get("align", QBLOCK) != QBLOCK for flat in self.buckets):
            raise ValueError(f"8-bit moments need parameters and shards at multiples of {QBLOCK} elements")

    def relink(self) -> None:
        """Read the step counts, and make the inner AdamW's per-parameter state views into the flat buffers
        (copying what a state dict load put there; zero where it put none)."""
        opt = self.opt
        counts = [int(opt.state.get(master, {}).get("step", 0)) for _, _, master in opt.pieces]
        self.steps = [0] * len(opt.param_groups)
        for g, count in zip(self.group_of_piece, counts):
            self.steps[g] = max(self.steps[g], count)
        self.lags = [self.steps[g] - count for g, count in zip(self.group_of_piece, counts)]
        self._relabel(set())
        if self._moments_in_state() or self.buckets[0]["exp_avg"] is not None:
            self._link_moments()

    def _moments_in_state(self) -> bool:
        """Whether the inner AdamW's state holds moments (loaded, or linked before)."""
        return any(
            key in self.opt.state.get(master, {}) for _, _, master in self.opt.pieces for key in MOMENTS
        )

    def _link_moments(self) -> None:
        if self.moments == "int8":  # codes and scales, not in the inner AdamW's state (_moments8_state)
            fresh = self.buckets[0]["exp_avg"] is None
            for flat in self.buckets:
                if flat["exp_avg"] is None:
                    allocate(flat)
            for track in self.tracks:
                self._find_state(track, scan=not fresh)
            return
        loaded = self._moments_in_state()
        for flat in self.buckets:
            for key in MOMENTS:
                if flat[key] is None:
                    flat[key] = torch.zeros_like(flat["master"])
        for bucket, piece, master in self.opt.pieces:
            window = slice(piece.shard_start, piece.shard_start + piece.numel)
            state = self.opt.state.setdefault(master, {})
            for key in MOMENTS:
                view = self.buckets[bucket][key][window]
                if key not in state:
                    view.zero_()
                elif state[key] is not view:
                    view.copy_(state[key].reshape(-1))
                state[key] = view
        for track in self.tracks:
            self._find_state(track, scan=loaded)

    # ------------------------------------------------------------------------------------- idle rows
    def track_rows(self, slot: int, rows: int, touched: torch.Tensor) -> bool:
        """Rows (along dim 0) of the parameter in `slot` whose `touched` entry is False have had only zero
        gradients: with zero moments (a row's moments stay zero until its gradient is not), AdamW moves such a
        row by weight decay alone, so its blocks skip the gradient and moments (and do nothing when the decay
        factor rounds to 1 in fp32, as 1 - 1e-4 * 1e-5 does). Rows with moments from a loaded state dict count
        as touched. False (nothing tracked) when a row's size is not a multiple of ALIGN: its blocks would lose
        the kernel's 16-byte accesses."""
        pieces = [(b, piece) for b, piece, _ in self.opt.pieces if piece.slot == slot]
        numel = max((piece.param_end for _, piece in pieces), default=0)
        if not pieces or numel % rows or (numel // rows) % ALIGN:
            return False
        track = {"pieces": pieces, "row_numel": numel // rows, "touched": touched}
        self._find_state(track)
        self.tracks.append(track)
        for bucket in {b for b, _ in pieces}:
            self._rebuild_runs(bucket)
        return True

    @staticmethod
    def _rows_of(piece: Any, size: int):
        """(row, start, end) in the shard for every row of `size` elements that `piece` holds part of."""
        for at in range(piece.param_start - piece.param_start % size, piece.param_end, size):
            start = piece.shard_start + max(at, piece.param_start) - piece.param_start
            yield at // size, start, piece.shard_start + min(at + size, piece.param_end) - piece.param_start

    def _find_state(self, track: dict[str, Any], scan: bool = True) -> None:
        """Which rows hold moments (nonzero anywhere in this rank's part of them): those count as touched.
        Without `scan` (the moments were just created: all zero), none."""
        stateful = torch.zeros_like(track["touched"])
        size = track["row_numel"]
        for bucket, piece in track["pieces"] if scan else ():
            flat = self.buckets[bucket]
            if flat["exp_avg"] is None:
                continue
            for row, start, end in self._rows_of(piece, size):
                for key in MOMENTS:
                    stateful[row] |= flat[key][start:end].ne(0).any()
        track["stateful"] = stateful

    def _idle_cuts(self, bucket: int) -> tuple[list[int], list[tuple[int, int, int]]]:
        """Row boundaries of tracked parameters in this bucket's shard, and (start, end, flag index) per row."""
        cuts, spans, base = [], [], 1  # flag 0: never idle (untracked blocks); tracks appended keep theirs
        for track in self.tracks:
            size = track["row_numel"]
            for b, piece in track["pieces"]:
                if b != bucket:
                    continue
                for row, start, end in self._rows_of(piece, size):
                    cuts += [start, end]
                    spans.append((start, end, base + row))
            base += len(track["touched"])
        return cuts, sorted(spans)

    def idle_flags(self) -> torch.Tensor | None:
        """Whether each tracked row is idle now, after flag 0 (never idle: untracked blocks); None untracked."""
        if not self.tracks:
            return None
        flags = [~(t["touched"] | t["stateful"]) for t in self.tracks]
        return torch.cat([flags[0].new_zeros(1), *flags])

    def idle_blocks(self, flat: dict[str, Any], flags: torch.Tensor | None = None) -> torch.Tensor | None:
        """Per block of `flat`, whether its row is idle now (None when nothing is tracked there); `flags`:
        idle_flags() when already computed for this step."""
        if flat.get("idle_index") is None:
            return None
        return (self.idle_flags() if flags is None else flags)[flat["idle_index"]]

    def _relabel(self, skipped: set[int]) -> None:
        """One row per (group, lag) among the pieces stepped now; rebuild the runs and blocks of buckets
        whose pieces changed row (none, while no parameter was ever skipped: one row per group, at lag 0)."""
        live = {
            (g, lag) for i, (g, lag) in enumerate(zip(self.group_of_piece, self.lags)) if i not in skipped
        }
        self.rows = sorted(live | {(g, 0) for g in range(len(self.steps))})
        row_of = {row: r for r, row in enumerate(self.rows)}
        changed = set()
        for i, (bucket, _, _) in enumerate(self.opt.pieces):
            label = None if i in skipped else row_of[(self.group_of_piece[i], self.lags[i])]
            if label != self.labels[i] or not self.buckets[bucket]["runs"]:
                self.labels[i] = label
                changed.add(bucket)
        for bucket in changed:
            self._rebuild_runs(bucket)
        self.padded = skipped

    def _rebuild_runs(self, bucket: int) -> None:
        pieces = sorted(
            (piece.shard_start, piece.shard_start + piece.numel, self.labels[i])
            for i, (b, piece, _) in enumerate(self.opt.pieces)
            if b == bucket and self.labels[i] is not None
        )
        runs: list[list[int]] = []
        for start, end, row in pieces:
            if runs and runs[-1][1] == start and runs[-1][2] == row:
                runs[-1][1] = end
            else:
                runs.append([start, end, row])
        flat = self.buckets[bucket]
        flat["runs"] = [tuple(run) for run in runs]
        cuts, spans = self._idle_cuts(bucket)
        blocks, flat["align"] = block_table(flat["runs"], flat["master"].numel(), BLOCK, ALIGN, cuts)
        device = flat["master"].device
        flat["blocks"] = torch.from_numpy(blocks).to(device)
        flat["idle_index"] = None
        if spans:  # each block's row flag (idle_blocks); untracked blocks read flag 0, never idle
            flat["idle_index"] = torch.from_numpy(flag_index(blocks[:, 0], spans)).to(device)
        if self.on_stage is not None:
            stage = self.stage_of_slot
            pieces = [(p.shard_start, p.shard_start + p.numel, stage.get(p.slot, 0))
                      for b, p, _ in sorted(self.opt.pieces, key=lambda x: x[1].shard_start) if b == bucket]  # fmt: skip
            flat["stages"] = split_by_stage(flat, pieces, self.stage_count)

    def set_stages(self, stage_of_slot: dict[int, int], count: int, on_stage) -> None:
        """Step the parameters in `count` stages (_update_stages), stage k holding the slots that
        `stage_of_slot` maps to k (0 for the rest); `on_stage(k)` is called after each stage's kernels."""
        self.stage_of_slot, self.stage_count, self.on_stage = stage_of_slot, count, on_stage
        for bucket in range(len(self.buckets)):
            self._rebuild_runs(bucket)

    def write_steps(self) -> None:
        """Put the step counts where torch keeps them (per parameter), for state dicts."""
        opt = self.opt
        for (_, _, master), g, lag in zip(opt.pieces, self.group_of_piece, self.lags):
            if self.steps[g] - lag:
                opt.state[master]["step"] = torch.tensor(float(self.steps[g] - lag))

    def table(self, device: torch.device) -> torch.Tensor:
        """Per row (group, lag): (1 - lr * wd, beta1, beta2, eps, lr / bias_correction1,
        sqrt(bias_correction2)), at the row's step count."""
        rows = []
        for g, lag in self.rows:
            group = self.opt.param_groups[g]
            step = max(self.steps[g] - lag, 1)  # a row no live piece uses may have count 0: any value
            beta1, beta2 = group["betas"]
            lr = float(group["lr"])
            rows.append([1.0 - lr * group["weight_decay"], beta1, beta2, group["eps"],
                         lr / (1.0 - beta1**step), math.sqrt(1.0 - beta2**step), 0.0, 0.0])  # fmt: skip
        return torch.tensor(rows, dtype=torch.float32).to(device, non_blocking=True)

    def grad_norm(self, norm_type: float) -> torch.Tensor:
        """The norm of this rank's gradient shards (padding and pieces no one used are zero): one pass of
        the sum-of-squares kernel per shard for the 2-norm on CUDA, torch's vector_norm otherwise."""
        grads = [flat["grad"] for flat in self.buckets]
        if self.kernel == "triton" and norm_type == 2.0:
            from ._flat_adamw_kernel import sum_of_squares

            return torch.stack([sum_of_squares(g) for g in grads]).sum().sqrt()
        norms = [torch.linalg.vector_norm(g, norm_type, dtype=torch.float32) for g in grads]
        return torch.linalg.vector_norm(torch.stack(norms), norm_type)

    @torch.no_grad()
    def step(self, coef: torch.Tensor | None, skipped: list[int] | tuple[int, ...] = ()) -> None:
        """One AdamW step of every bucket; gradients are multiplied by `coef` (the clipping) as they are read.
        `skipped`: pieces (indices into opt.pieces) left untouched, their step count not advanced."""
        if self.buckets[0]["exp_avg"] is None:
            self._link_moments()
        self.steps = [s + 1 for s in self.steps]
        if skipped or self.padded:
            for i in skipped:
                self.lags[i] += 1
            self._relabel(set(skipped))
        table = self.table(self.opt.masters[0].device)
        run = triton_step if self.kernel == "triton" else torch_step
        flags = self.idle_flags()  # once per step, for every bucket
        for k in range(self.stage_count):
            for flat in self.buckets:
                narrow = flat["stages"][k] if self.on_stage is not None else {}
                if narrow is not None:
                    part = {**flat, **narrow}  # the stage's blocks of this bucket
                    run(part, table, coef, self.idle_blocks(part, flags))
            if self.on_stage is not None:
                self.on_stage(k)
        self.masters_behind = bool(self.kept)

    # ------------------------------------------------------------------------------------- remainders
    def sync_masters(self) -> None:
        """Decode the fp32 masters that the steps since the last call kept as parameter and remainder."""
        if self.masters_behind:
            for flat in self.kept:
                flat["master"].copy_(decode(flat["out"], flat["rem"]))
            self.masters_behind = False

    def encode_masters(self) -> None:
        """Masters were set (a state dict load): write them as parameter and remainder (ties move one ulp)."""
        for flat in self.kept:
            encode_(flat["master"], flat["out"], flat["rem"])
        self.masters_behind = False

    def masters_from_params(self) -> None:
        """The parameters were changed outside and the masters re-read from them: zero remainders."""
        for flat in self.kept:
            flat["rem"].zero_()
        self.masters_behind = False
