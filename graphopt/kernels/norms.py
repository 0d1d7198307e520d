"""graphopt::layer_norm and graphopt::rms_norm, each with an optional residual add fused in.

    s = x + residual (or x);  out = norm(s) * weight (+ bias);  residual_out = s

The norm runs over the last dim with fp32 statistics. ``s`` is rounded to x's dtype
first, as the unfused graph (an add, then the norm) rounds it, so ``residual_out`` and the
statistics see the same numbers. ``residual_out`` is always a new tensor (a custom op's
outputs may not alias its inputs), so without a residual it is a copy of x.

One Triton program normalises one row held wholly in registers: one read of x (and of
the residual), one write of out and of residual_out. Rows longer than
``MAX_FUSED_ROW`` would not fit in registers and take the reference path instead.
"""

import torch
import torch.nn.functional as F
from torch import Tensor

from graphopt.kernels._triton import next_power_of_2, tl, triton

__all__ = [
    "MAX_FUSED_ROW",
    "check_norm",
    "norm_fake",
    "layer_norm_reference",
    "rms_norm_reference",
    "layer_norm_triton",
    "rms_norm_triton",
]

MAX_FUSED_ROW = 16384


def check_norm(op: str, x: Tensor, residual: Tensor | None, weight: Tensor, bias: Tensor | None) -> None:
    """Shape and dtype rules shared by every implementation (works on symbolic shapes)."""
    torch._check(x.dim() >= 1 and x.dtype.is_floating_point, lambda: f"graphopt::{op}: expected a floating tensor [..., N], got {x.dtype} {tuple(x.shape)}")
    if residual is not None:
        torch._check(
            residual.shape == x.shape and residual.dtype == x.dtype,
            lambda: f"graphopt::{op}: residual {residual.dtype} {tuple(residual.shape)} must match x {x.dtype} {tuple(x.shape)}",
        )
    for name, param in (("weight", weight), ("bias", bias)):
        if param is not None:
            message = f"graphopt::{op}: {name} {tuple(param.shape)} must be [N] = [{x.shape[-1]}]"
            torch._check(param.dim() == 1 and param.shape[0] == x.shape[-1], lambda message=message: message)


def norm_fake(op: str, x: Tensor, residual: Tensor | None, weight: Tensor, bias: Tensor | None) -> tuple[Tensor, Tensor]:
    check_norm(op, x, residual, weight, bias)
    return x.new_empty(x.shape), x.new_empty(x.shape)


def _residual_sum(x: Tensor, residual: Tensor | None) -> Tensor:
    return (x + residual if residual is not None else x.clone()).contiguous()


def layer_norm_reference(x: Tensor, residual: Tensor | None, weight: Tensor, bias: Tensor | None, eps: float) -> tuple[Tensor, Tensor]:
    """The CPU implementation: F.layer_norm on s upcast to fp32."""
    check_norm("layer_norm", x, residual, weight, bias)
    s = _residual_sum(x, residual)
    out = F.layer_norm(s.float(), (s.shape[-1],), weight.float(), bias.float() if bias is not None else None, eps)
    return out.to(x.dtype), s


def rms_norm_reference(x: Tensor, residual: Tensor | None, weight: Tensor, eps: float) -> tuple[Tensor, Tensor]:
    """The CPU implementation: F.rms_norm on s upcast to fp32."""
    check_norm("rms_norm", x, residual, weight, None)
    s = _residual_sum(x, residual)
    out = F.rms_norm(s.float(), (s.shape[-1],), weight.float(), eps)
    return out.to(x.dtype), s


# --- Triton -------------------------------------------------------------------------------


@triton.jit
def _norm_kernel(
    x_ptr, residual_ptr, weight_ptr, bias_ptr, out_ptr, residual_out_ptr,
    N, stride_x, stride_r, eps,
    IS_RMS: tl.constexpr, HAS_RESIDUAL: tl.constexpr, HAS_BIAS: tl.constexpr, BLOCK_N: tl.constexpr,
):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK_N)
    col_ok = cols < N
    s = tl.load(x_ptr + row * stride_x + cols, mask=col_ok, other=0.0)
    if HAS_RESIDUAL:
        # rounded to x's dtype, as the unfused add would round it
        s = (s.to(tl.float32) + tl.load(residual_ptr + row * stride_r + cols, mask=col_ok, other=0.0).to(tl.float32)).to(s.dtype)
    # contiguous outputs: row * N
    tl.store(residual_out_ptr + row * N + cols, s, mask=col_ok)
    s = s.to(tl.float32)
    if IS_RMS:
        centred = s
    else:
        mean = tl.sum(s, axis=0) / N
        centred = tl.where(col_ok, s - mean, 0.0)
    # eps cast: inductor passes Python floats as fp64, which would make this fp64 math
    rstd = tl.rsqrt(tl.sum(centred * centred, axis=0) / N + tl.cast(eps, tl.float32))
    y = centred * rstd * tl.load(weight_ptr + cols, mask=col_ok, other=0.0).to(tl.float32)
    if HAS_BIAS:
        y += tl.load(bias_ptr + cols, mask=col_ok, other=0.0).to(tl.float32)
    tl.store(out_ptr + row * N + cols, y.to(out_ptr.dtype.element_ty), mask=col_ok)


def _rows(t: Tensor) -> Tensor:
    """t as [rows, N] with unit stride along N (a view when the layout allows)."""
    t2d = t.reshape(-1, t.shape[-1])
    return t2d if t2d.stride(-1) == 1 else t2d.contiguous()


def _norm_triton(is_rms: bool, x: Tensor, residual: Tensor | None, weight: Tensor, bias: Tensor | None, eps: float) -> tuple[Tensor, Tensor]:
    from torch.library import wrap_triton

    n = x.shape[-1]
    x2d = _rows(x)
    r2d = _rows(residual) if residual is not None else x2d
    out = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    residual_out = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    rows = x2d.shape[0]
    if rows > 0 and n > 0:
        block = next_power_of_2(n)
        # enough warps that each thread holds at most ~16 fp32 values of the row
        warps = min(16, max(1, block // 512))
        wrap_triton(_norm_kernel)[(rows,)](
            x2d, r2d, weight.contiguous(), bias.contiguous() if bias is not None else weight, out, residual_out,
            n, x2d.stride(0), r2d.stride(0), eps,
            IS_RMS=is_rms, HAS_RESIDUAL=residual is not None, HAS_BIAS=bias is not None, BLOCK_N=block, num_warps=warps,
        )
    return out, residual_out


def layer_norm_triton(x: Tensor, residual: Tensor | None, weight: Tensor, bias: Tensor | None, eps: float) -> tuple[Tensor, Tensor]:
    """Launch the Triton kernel (CUDA tensors, or CPU tensors under TRITON_INTERPRET=1)."""
    check_norm("layer_norm", x, residual, weight, bias)
    if x.shape[-1] > MAX_FUSED_ROW:
        return layer_norm_reference(x, residual, weight, bias, eps)
    return _norm_triton(False, x, residual, weight, bias, eps)


def rms_norm_triton(x: Tensor, residual: Tensor | None, weight: Tensor, eps: float) -> tuple[Tensor, Tensor]:
    """Launch the Triton kernel (CUDA tensors, or CPU tensors under TRITON_INTERPRET=1)."""
    check_norm("rms_norm", x, residual, weight, None)
    if x.shape[-1] > MAX_FUSED_ROW:
        return rms_norm_reference(x, residual, weight, eps)
    return _norm_triton(True, x, residual, weight, None, eps)
