"""graphopt::swiglu and graphopt::geglu: the gated MLP's ``act(gate) * up`` in one pass.

    swiglu(gate, up)              = silu(gate) * up
    geglu(gate, up, approximate)  = gelu(gate) * up     (tanh form when approximate)

gate and up have the same shape and dtype; the product is computed in fp32 and rounded
once to their dtype. They are often the two halves of one projection
(``gate, up = h.chunk(2, -1)``): such views are read in place (rows of unit-stride
elements with any row stride), not copied.
"""

import torch
import torch.nn.functional as F
from torch import Tensor

from graphopt.kernels._triton import tl, triton

__all__ = ["check_gate", "gate_fake", "swiglu_reference", "geglu_reference", "swiglu_triton", "geglu_triton"]

_SILU, _GELU, _GELU_TANH = 0, 1, 2


def check_gate(op: str, gate: Tensor, up: Tensor) -> None:
    torch._check(
        gate.shape == up.shape and gate.dtype == up.dtype and gate.dtype.is_floating_point,
        lambda: f"graphopt::{op}: gate and up must share shape and a floating dtype; got {gate.dtype} {tuple(gate.shape)} and {up.dtype} {tuple(up.shape)}",
    )


def gate_fake(op: str, gate: Tensor, up: Tensor) -> Tensor:
    check_gate(op, gate, up)
    return gate.new_empty(gate.shape)


def swiglu_reference(gate: Tensor, up: Tensor) -> Tensor:
    check_gate("swiglu", gate, up)
    return (F.silu(gate.float()) * up.float()).to(gate.dtype).contiguous()


def geglu_reference(gate: Tensor, up: Tensor, approximate: bool = False) -> Tensor:
    check_gate("geglu", gate, up)
    act = F.gelu(gate.float(), approximate="tanh" if approximate else "none")
    return (act * up.float()).to(gate.dtype).contiguous()


# --- Triton -------------------------------------------------------------------------------

_BLOCK = 1024


@triton.jit
def _gate_kernel(gate_ptr, up_ptr, out_ptr, N, stride_gate, stride_up, ACTIVATION: tl.constexpr, BLOCK: tl.constexpr):
    # one program per BLOCK elements of one row; a row's blocks are neighbours
    blocks_per_row = tl.cdiv(N, BLOCK)
    pid = tl.program_id(0)
    row = (pid // blocks_per_row).to(tl.int64)
    cols = (pid % blocks_per_row).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    ok = cols < N
    g = tl.load(gate_ptr + row * stride_gate + cols, mask=ok, other=0.0).to(tl.float32)
    u = tl.load(up_ptr + row * stride_up + cols, mask=ok, other=0.0).to(tl.float32)
    if ACTIVATION == 0:
        a = g * tl.sigmoid(g)
    elif ACTIVATION == 1:
        a = 0.5 * g * (1.0 + tl.erf(g * 0.7071067811865476))
    else:
        a = g * tl.sigmoid(1.5957691216057308 * (g + 0.044715 * g * g * g))  # 0.5(1 + tanh(u)) = sigmoid(2u)
    tl.store(out_ptr + row * N + cols, (a * u).to(out_ptr.dtype.element_ty), mask=ok)


def _rows(t: Tensor, contiguous: bool) -> Tensor:
    """t as [rows, N] with unit stride along N (a view when the layout allows); one long
    row when both operands are contiguous, so that short rows do not waste programs."""
    if contiguous:
        return t.reshape(1, -1)
    t2d = t.reshape(-1, t.shape[-1])
    return t2d if t2d.stride(-1) == 1 else t2d.contiguous()


def _gate_triton(activation: int, gate: Tensor, up: Tensor) -> Tensor:
    from torch.library import wrap_triton

    out = torch.empty(gate.shape, dtype=gate.dtype, device=gate.device)
    if out.numel() > 0:
        contiguous = gate.is_contiguous() and up.is_contiguous()
        g2d, u2d = _rows(gate, contiguous), _rows(up, contiguous)
        rows, n = g2d.shape
        wrap_triton(_gate_kernel)[(rows * triton.cdiv(n, _BLOCK),)](
            g2d, u2d, out, n, g2d.stride(0), u2d.stride(0), ACTIVATION=activation, BLOCK=_BLOCK, num_warps=4,
        )
    return out


def swiglu_triton(gate: Tensor, up: Tensor) -> Tensor:
    """Launch the Triton kernel (CUDA tensors, or CPU tensors under TRITON_INTERPRET=1)."""
    check_gate("swiglu", gate, up)
    return _gate_triton(_SILU, gate, up)


def geglu_triton(gate: Tensor, up: Tensor, approximate: bool = False) -> Tensor:
    """Launch the Triton kernel (CUDA tensors, or CPU tensors under TRITON_INTERPRET=1)."""
    check_gate("geglu", gate, up)
    return _gate_triton(_GELU_TANH if approximate else _GELU, gate, up)
