"""Per-embodiment matmuls as one grouped GEMM over the batch sorted by slot (GR00TConfig.grouped_embodiment_gemms).

The release's form, `bmm(x, W[slot])`, gathers a copy of its slot's [in, out] matrix for every sample: for
n1.6-3b's 325 M table entries that is 16 copies per layer at batch 16, in fp32, then cast, and a backward that
zero-fills the whole [slots, in, out] table gradient, scatters 16 per-sample gradients into it and sums them.
Sorted by slot, each used slot's rows go through one GEMM that reads its matrix once, and the weight gradient of
slot s is one GEMM, rows_s^T @ grad_s, written into the table (empty slots get zeros). torch._grouped_mm takes
the group boundaries as a device tensor, so nothing syncs with the host and CUDA graphs capture it. The sort is
done once per forward (`SlotGroups`) and shared by every layer.
"""

from __future__ import annotations

import functools

import torch


def grouped_supported(x: torch.Tensor, weight: torch.Tensor) -> bool:
    """Whether `slot_matmul` can run here: torch has _grouped_mm; on CUDA only its bf16 kernels on Hopper (sm90)
    with 16-byte aligned rows; on CPU torch's reference implementation takes any float dtype."""
    if not hasattr(torch, "_grouped_mm"):
        return False
    if x.device.type == "cpu":
        return True
    if x.device.type != "cuda" or torch.cuda.get_device_capability(x.device)[0] != 9:
        return False
    dtype = torch.get_autocast_dtype("cuda") if torch.is_autocast_enabled("cuda") else weight.dtype
    return dtype == torch.bfloat16 and weight.shape[1] % 8 == 0 and weight.shape[2] % 8 == 0


class SlotGroups:
    """A batch's samples grouped by slot, computed once per forward (on first use: layers that fall back to
    the gather never pay for it) and shared by its grouped layers: the stable sort, its inverse and the samples
    per slot. Sorting in every layer cost about 70 us of small kernels per layer (two sorts, fills, an index
    add) on an H200, seven layers per training forward of n1.6-3b."""

    def __init__(self, slot: torch.Tensor, slots: int) -> None:
        self.slot, self.slots = slot, slots
        self._ends: dict[int, torch.Tensor] = {}

    @functools.cached_property
    def order(self) -> torch.Tensor:
        return torch.argsort(self.slot, stable=True)

    @functools.cached_property
    def inverse(self) -> torch.Tensor:
        """Back to batch order."""
        return torch.argsort(self.order)

    @functools.cached_property
    def counts(self) -> torch.Tensor:
        ones = torch.ones_like(self.slot, dtype=torch.int32)
        return torch.zeros(self.slots, dtype=torch.int32, device=self.slot.device).index_add_(
            0, self.slot, ones
        )

    def ends(self, tokens: int) -> torch.Tensor:
        """Where group g's rows end (int32) when every sample has `tokens` rows."""
        if tokens not in self._ends:
            self._ends[tokens] = (self.counts * tokens).cumsum(0, dtype=torch.int32)
        return self._ends[tokens]


def slot_tensor(slot: torch.Tensor | SlotGroups) -> torch.Tensor:
    """The [B] slot indices of either form."""
    return slot.slot if isinstance(slot, SlotGroups) else slot


def slot_matmul(x: torch.Tensor, weight: torch.Tensor, slot: torch.Tensor | SlotGroups) -> torch.Tensor:
    """x [B, T, in] @ weight[slot[b]] for every sample b -> [B, T, out]; weight [slots, in, out]; `slot` the [B]
    indices or their SlotGroups. Under autocast both operands are cast to its dtype first, as for bmm."""
    batch, tokens, fan_in = x.shape
    groups = slot if isinstance(slot, SlotGroups) else SlotGroups(slot, weight.shape[0])
    if groups.slots != weight.shape[0]:
        raise ValueError(f"SlotGroups of {groups.slots} slots for a table of {weight.shape[0]}")
    device_type = x.device.type
    if torch.is_autocast_enabled(device_type):
        dtype = torch.get_autocast_dtype(device_type)
        x, weight = x.to(dtype), weight.to(dtype)
    with torch.autocast(device_type, enabled=False):
        rows = x[groups.order].reshape(batch * tokens, fan_in)
        out = _GroupedMatmul.apply(rows, weight, groups.ends(tokens))
        return out.view(batch, tokens, -1)[groups.inverse]


class _GroupedMatmul(torch.autograd.Function):
    """rows [M, in] (sorted by group) @ weight[g] [in, out] per group of rows ending at ends[g]."""

    @staticmethod
    def forward(ctx, rows: torch.Tensor, weight: torch.Tensor, ends: torch.Tensor) -> torch.Tensor:
        ctx.save_for_backward(rows, weight, ends)
        return torch._grouped_mm(rows, weight, offs=ends)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        rows, weight, ends = ctx.saved_tensors
        grad = grad.contiguous()  # a sum's gradient arrives expanded (stride 0)
        grad_rows = grad_weight = None
        if ctx.needs_input_grad[0]:
            grad_rows = torch._grouped_mm(grad, weight.transpose(-2, -1), offs=ends)
        if ctx.needs_input_grad[1]:  # groups along the contraction: [slots, in, out], zeros for empty slots
            grad_weight = torch._grouped_mm(rows.t(), grad, offs=ends)
        return grad_rows, grad_weight, None
