"""Frozen linear layers whose weights are prepared once for a faster GEMM: padded, and optionally in FP8.

A frozen `nn.Linear` reads the same weight every step, so what its GEMM reads can be prepared ahead:

- Padding. SigLIP2's MLP is 4304 wide, not a multiple of 128. Compiled, its down-projection (K = 4304) does
  not get cuBLAS's fused-bias kernel: the bias is first broadcast-copied into the output and the GEMM adds
  onto it (a 24 MB copy per layer at batch 16, two cameras). With the up-projection's outputs and the
  down-projection's inputs padded with zeros to 4352, both GEMMs take fused-bias kernels and the activation
  between (gelu(0) = 0) carries zeros: the same result, bit for bit on an H200, 1.9 ms less per step
  (benchmarks/probes/frozen_probe.py).
- GELU in the GEMM. SigLIP2's up-projection is followed by tanh-approximated GELU, a separate pass over its
  10368x4352 bf16 output per layer. cuBLASLt applies GELU (tanh) in the GEMM's epilogue instead
  (`torch._addmm_activation`, which Inductor calls as is): the pass disappears (0.196 -> 0.159 ms per
  layer on an H200). In a training step the losses equal those of the two-pass path to the last digit; the
  GPU test bounds the epilogue's rounding by the two-pass path's.
- FP8 (opt-in). Weights in float8 e4m3 with one scale per output row; activations quantized per row as they
  arrive (under torch.compile the scale and cast fuse into the kernel that produced them); `torch._scaled_mm`
  multiplies with fp32 accumulation and writes bf16. 810-1090 TFLOP/s on an H200 against 580-730 in bf16,
  though quantizing an activation costs a pass over it where no earlier kernel absorbs it. It
  changes the numerics (3 mantissa bits per operand where bf16 has 7), so a loss-parity run vouches for it;
  `_scaled_mm` has no backward, so only layers run without gradients (the frozen prefix) may use it. On a
  CPU the same product is computed from the dequantized operands (no speed-up there; for tests and debugging).

The module keeps the original `weight` and `bias` parameters (names, state dict and checkpoints do not
change), so the prepared copy is extra memory: 0.5 GB for n1.6-3b's padded MLPs in bf16, 1 byte per weight
for FP8. The prepared tensors are plain attributes, not buffers (torch DDP would broadcast buffers, and gloo
has no fp8), derived by `refresh()`, which runs after any `load_state_dict` into the module and after `.to()`;
it writes in place where it can, so captured CUDA graphs stay valid.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

FP8 = torch.float8_e4m3fn
FP8_MAX = 448.0  # the largest finite e4m3fn value
ALIGN = 16  # _scaled_mm needs both matrix sides divisible by 16
TILE = 128  # cuBLAS's Hopper GEMM tile width


class FrozenLinear(nn.Module):
    """A frozen nn.Linear computed from a prepared weight: `pad_in` zero input columns (the input arrives that
    much wider, its extra entries zero), `pad_out` zero output rows (the output is that much wider, zeros
    there plus a zero bias), with `gelu` tanh-approximated GELU applied to the output (in the GEMM's epilogue
    where cuBLASLt takes it), and with `fp8` an FP8 GEMM with rowwise scales (module docstring)."""

    def __init__(
        self,
        linear: nn.Linear | FrozenLinear,
        *,
        pad_in: int = 0,
        pad_out: int = 0,
        fp8: bool = False,
        gelu: bool = False,
    ) -> None:
        """`linear`: the layer whose `weight` and `bias` parameters this one computes with (an nn.Linear, or
        a FrozenLinear being re-prepared)."""
        super().__init__()
        if any(p.requires_grad for p in linear.parameters()):
            raise ValueError(
                "FrozenLinear wraps frozen layers only: this nn.Linear has a trainable parameter"
            )
        if fp8 and not fp8_fits(linear.in_features + pad_in, linear.out_features + pad_out):
            raise ValueError(
                f"an FP8 FrozenLinear needs both sizes divisible by {ALIGN}, got "
                f"{linear.in_features + pad_in}x{linear.out_features + pad_out}"
            )
        self.in_features, self.out_features = linear.in_features, linear.out_features
        self.pad_in, self.pad_out, self.fp8, self.gelu = pad_in, pad_out, fp8, gelu
        self.weight = linear.weight
        self.bias = linear.bias
        self.register_load_state_dict_post_hook(lambda module, _keys: module.refresh())
        self.refresh()

    def extra_repr(self) -> str:
        return (
            f"in_features={self.in_features}+{self.pad_in}, out_features={self.out_features}+{self.pad_out}, "
            f"fp8={self.fp8}, gelu={self.gelu}"
        )

    @torch.no_grad()
    def refresh(self) -> None:
        """Prepare the GEMM's operands from the current weight and bias (after they changed)."""
        weight = F.pad(self.weight, (0, self.pad_in, 0, self.pad_out))
        bias = None if self.bias is None else F.pad(self.bias, (0, self.pad_out))
        if self.fp8:
            scale = weight.float().abs().amax(dim=1, keepdim=True).clamp(min=1e-12) / FP8_MAX
            prepared = {"fp8_weight": (weight.float() / scale).to(FP8), "fp8_scale": scale.reshape(1, -1)}
        else:
            prepared = {"prepared_weight": weight}
        prepared["prepared_bias"] = bias
        store_prepared(self, prepared)

    def _apply(self, fn, recurse=True):
        out = super()._apply(fn, recurse)
        self.refresh()  # follow the weight's device and dtype
        return out

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        autocast = torch.is_autocast_enabled(x.device.type)
        dtype = torch.get_autocast_dtype(x.device.type) if autocast else x.dtype
        if self.fp8:
            out = self._fp8_forward(x, dtype)
            return F.gelu(out, approximate="tanh") if self.gelu else out
        if not (self.gelu and x.is_cuda and self.prepared_bias is not None):
            # (on a CPU _addmm_activation's GELU is the exact one, not tanh)
            out = F.linear(x, self.prepared_weight, self.prepared_bias)
            return F.gelu(out, approximate="tanh") if self.gelu else out
        weight, bias = self.prepared_weight.to(dtype), self.prepared_bias.to(dtype)
        rows = x.reshape(-1, x.shape[-1]).to(dtype)
        out = torch._addmm_activation(bias, rows, weight.t(), use_gelu=True)
        return out.reshape(*x.shape[:-1], out.shape[-1])

    def _fp8_forward(self, x: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
        rows = x.reshape(-1, x.shape[-1]).float()
        scale = rows.abs().amax(dim=1, keepdim=True).clamp(min=1e-12) / FP8_MAX
        bias = None if self.prepared_bias is None else self.prepared_bias.to(dtype)
        quantized = (rows / scale).to(FP8)
        if x.is_cuda:
            out = torch._scaled_mm(
                quantized,
                self.fp8_weight.t(),
                scale_a=scale,
                scale_b=self.fp8_scale,
                bias=bias,
                out_dtype=dtype,
            )
        else:  # the same product from the dequantized operands (CPU _scaled_mm takes only per-tensor scales)
            weight = self.fp8_weight.float() * self.fp8_scale.reshape(-1, 1)
            out = ((quantized.float() * scale) @ weight.t()).to(dtype)
            out = out if bias is None else out + bias
        return out.reshape(*x.shape[:-1], out.shape[-1])


def store_prepared(module: nn.Module, prepared: dict[str, torch.Tensor | None]) -> None:
    """Set `module`'s prepared tensors (plain attributes): in place where one of the same shape, dtype and
    device is there (captured CUDA graphs read it), else as a new contiguous tensor."""
    for name, value in prepared.items():
        old = getattr(module, name, None)
        same = old is not None and value is not None
        if same and (old.shape, old.dtype, old.device) == (value.shape, value.dtype, value.device):
            old.copy_(value)
        else:
            setattr(module, name, None if value is None else value.contiguous())


def fp8_fits(in_features: int, out_features: int) -> bool:
    return in_features % ALIGN == 0 and out_features % ALIGN == 0


def is_frozen_linear(module: nn.Module) -> bool:
    """A plain nn.Linear (or subclass) whose parameters are all frozen."""
    return isinstance(module, nn.Linear) and not any(p.requires_grad for p in module.parameters())


def pad_mlp(mlp: nn.Module, up: str = "fc1", down: str = "fc2") -> bool:
    """Pad a frozen MLP's hidden width to a multiple of TILE: `up`'s outputs and `down`'s inputs (the activation
    between must map 0 to 0). False, unchanged, when it is already aligned or either layer trains."""
    fc1, fc2 = getattr(mlp, up), getattr(mlp, down)
    extra = -fc1.out_features % TILE
    if extra == 0 or not (is_frozen_linear(fc1) and is_frozen_linear(fc2)):
        return False
    setattr(mlp, up, FrozenLinear(fc1, pad_out=extra))
    setattr(mlp, down, FrozenLinear(fc2, pad_in=extra))
    return True


def gelu_into_gemm(mlp: nn.Module, up: str = "fc1", activation: str = "activation_fn") -> bool:
    """A frozen MLP whose activation is tanh-approximated GELU computes it in `up`'s GEMM (its activation
    becomes nn.Identity; `up`'s padding, if any, is kept). False, unchanged, when the activation is another
    function or `up` trains."""
    fc1, act = getattr(mlp, up), getattr(mlp, activation)
    frozen = is_frozen_linear(fc1) or isinstance(fc1, FrozenLinear)
    if not (frozen and _is_gelu_tanh(act)) or getattr(fc1, "gelu", False):
        return False
    kept = {
        key: getattr(fc1, key, default) for key, default in (("pad_in", 0), ("pad_out", 0), ("fp8", False))
    }
    setattr(mlp, up, FrozenLinear(fc1, **kept, gelu=True))
    setattr(mlp, activation, nn.Identity())
    return True


def _is_gelu_tanh(act: nn.Module) -> bool:
    """torch's nn.GELU(approximate="tanh") (SigLIP2's gelu_pytorch_tanh)."""
    return isinstance(act, nn.GELU) and act.approximate == "tanh"


def use_fp8(scopes: list[nn.Module], exclude: tuple[str, ...] = ()) -> int:
    """Every frozen linear layer under `scopes` whose sizes FP8 takes, and whose name within its scope does
    not end with one of `exclude`, computes in FP8 (an nn.Linear or a padded FrozenLinear is replaced by an
    FP8 FrozenLinear with the same parameters and padding). The caller guarantees that they run without
    gradients. Returns how many layers under `scopes` compute in FP8 after the call."""
    count = 0
    for scope in scopes:
        for name, child in list(scope.named_modules()):
            if (
                not name
                or name.endswith(exclude)
                or not (is_frozen_linear(child) or isinstance(child, FrozenLinear))
            ):
                continue
            pad_in, pad_out = getattr(child, "pad_in", 0), getattr(child, "pad_out", 0)
            if not getattr(child, "fp8", False):
                if not fp8_fits(child.in_features + pad_in, child.out_features + pad_out):
                    continue
                parent_name, _, attr = name.rpartition(".")
                parent = scope.get_submodule(parent_name) if parent_name else scope
                gelu = getattr(child, "gelu", False)
                setattr(
                    parent, attr, FrozenLinear(child, pad_in=pad_in, pad_out=pad_out, fp8=True, gelu=gelu)
                )
            count += 1
    return count


class MergedFrozenLinear(nn.Module):
    """Frozen nn.Linears that read the same input (SigLIP2's q, k and v projections), computed as one GEMM
    over their weights stacked once; the output holds theirs side by side. At batch 16 with two cameras on
    an H200 one 10368x1152x3456 GEMM replaces three 10368x1152x1152 ones. The layers stay where they are
    (names, state dict and checkpoints do not change); the stacked copy is extra memory (0.2 GB for
    n1.6-3b's SigLIP2), refreshed like FrozenLinear's after a load_state_dict and after `.to()`."""

    def __init__(self, linears: list[nn.Linear]) -> None:
        super().__init__()
        if not linears or not all(is_frozen_linear(layer) for layer in linears):
            raise ValueError("MergedFrozenLinear stacks frozen nn.Linear layers only")
        if (
            len({layer.in_features for layer in linears}) != 1
            or len({layer.bias is None for layer in linears}) != 1
        ):
            raise ValueError("the stacked layers need the same input width and all or none with a bias")
        self.sources = tuple(linears)  # a tuple: not registered twice (the state dict keeps the originals)
        self.register_load_state_dict_post_hook(lambda module, _keys: module.refresh())
        self.refresh()

    def extra_repr(self) -> str:
        return f"in_features={self.sources[0].in_features}, out_features={[s.out_features for s in self.sources]}"

    @torch.no_grad()
    def refresh(self) -> None:
        """Stack the current weights and biases again (after they changed)."""
        weight = torch.cat([layer.weight for layer in self.sources])
        bias = None if self.sources[0].bias is None else torch.cat([layer.bias for layer in self.sources])
        store_prepared(self, {"prepared_weight": weight, "prepared_bias": bias})

    def _apply(self, fn, recurse=True):
        out = super()._apply(fn, recurse)
        self.refresh()  # the sources, registered before this module under the same parent, moved first
        return out

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(x, self.prepared_weight, self.prepared_bias)


def merge_qkv(attention: nn.Module) -> bool:
    """Give a frozen attention module with q_proj, k_proj and v_proj a `qkv` MergedFrozenLinear over them (its
    forward is then the caller's to route; see _vision.VisionLayer). False, unchanged, when any of them trains
    or is no plain nn.Linear, or it already has one."""
    layers = [getattr(attention, name, None) for name in ("q_proj", "k_proj", "v_proj")]
    if hasattr(attention, "qkv") or not all(
        layer is not None and is_frozen_linear(layer) for layer in layers
    ):
        return False
    attention.qkv = MergedFrozenLinear(layers)
    return True
