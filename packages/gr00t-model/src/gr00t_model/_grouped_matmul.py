"""Per-embodiment matmuls as one grouped GEMM over the batch sorted by slot (GR00TConfig.grouped_embodiment_gemms).

The release's form, `bmm(x, W[slot])`, gathers a copy of its slot's [in, out] matrix for every sample: for
n1.6-3b's 325 M table entries that is 16 copies per layer at batch 16, in fp32, then cast, and a backward that
zero-fills the whole [slots, in, out] table gradient, scatters 16 per-sample gradients into it and sums them.
Sorted by slot, each used slot's rows go through one GEMM that reads its matrix once, and the weight gradient of
slot s is one GEMM, rows_s^T @ grad_s, written into the table (empty slots get zeros). torch._grouped_mm takes
the group boundaries as a device tensor, so nothing syncs with the host and CUDA graphs capture it.
"""

from __future__ import annotations

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


def slot_matmul(x: torch.Tensor, weight: torch.Tensor, slot: torch.Tensor) -> torch.Tensor:
    """x [B, T, in] @ weight[slot[b]] for every sample b -> [B, T, out]; weight [slots, in, out]. Under autocast
    both operands are cast to its dtype first, as autocast does for bmm."""
    batch, tokens, fan_in = x.shape
    device_type = x.device.type
    if torch.is_autocast_enabled(device_type):
        dtype = torch.get_autocast_dtype(device_type)
        x, weight = x.to(dtype), weight.to(dtype)
    with torch.autocast(device_type, enabled=False):
        order = torch.argsort(slot, stable=True)
        rows = x[order].reshape(batch * tokens, fan_in)
        per_slot = torch.zeros(weight.shape[0], dtype=torch.int32, device=x.device)
        per_slot.index_add_(0, slot, torch.full_like(slot, tokens, dtype=torch.int32))
        ends = per_slot.cumsum(0, dtype=torch.int32)  # group g's rows end at ends[g]
        out = _GroupedMatmul.apply(rows, weight, ends)
        return out.view(batch, tokens, -1)[torch.argsort(order)]  # back to batch order


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
