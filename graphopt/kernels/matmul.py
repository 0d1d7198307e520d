"""graphopt::linear_act: ``activation(x @ w + bias)`` with the bias and activation fused
into the matmul's epilogue.

x ``[..., K]``, w ``[K, N]`` (an ``nn.Linear`` weight is passed as ``weight.t()``: any
strides work, nothing is copied), bias ``[N]`` or None. Activations: ``none``, ``relu``,
``gelu`` (erf form), ``gelu_tanh`` and ``silu``. The product is accumulated in fp32 and
the epilogue runs in fp32 on the accumulator, so the result is rounded once (torch's
unfused ops round after the matmul and again after each elementwise op).

The Triton kernel is the tiled matmul of Triton's tutorial: output tiles grouped along M
so that neighbouring programs reuse the same columns of w from L2, fp32 accumulation,
then bias + activation before the single store.
"""

import torch
import torch.nn.functional as F
from torch import Tensor

from graphopt.kernels._triton import autotune_configs, dot_precision, tl, triton

__all__ = ["ACTIVATIONS", "check_linear_act", "linear_act_reference", "linear_act_triton", "linear_act_fake", "apply_activation"]

# name -> the constexpr code the kernel switches on
ACTIVATIONS = {"none": 0, "relu": 1, "gelu": 2, "gelu_tanh": 3, "silu": 4}


def check_linear_act(x: Tensor, w: Tensor, bias: Tensor | None, activation: str) -> None:
    """Shape, dtype and activation rules shared by every implementation."""
    if activation not in ACTIVATIONS:
        raise ValueError(f"graphopt::linear_act: unknown activation {activation!r}; expected one of {sorted(ACTIVATIONS)}")
    torch._check(x.dim() >= 1 and w.dim() == 2, lambda: f"graphopt::linear_act: expected x [..., K] and w [K, N]; got {tuple(x.shape)} and {tuple(w.shape)}")
    torch._check(x.shape[-1] == w.shape[0], lambda: f"graphopt::linear_act: x {tuple(x.shape)} and w {tuple(w.shape)} disagree on K")
    torch._check(x.dtype == w.dtype and x.dtype.is_floating_point, lambda: f"graphopt::linear_act: x and w must share a floating dtype; got {x.dtype} and {w.dtype}")
    if bias is not None:
        torch._check(bias.dim() == 1 and bias.shape[0] == w.shape[1], lambda: f"graphopt::linear_act: bias {tuple(bias.shape)} must be [N] = [{w.shape[1]}]")


def linear_act_fake(x: Tensor, w: Tensor, bias: Tensor | None = None, activation: str = "none") -> Tensor:
    check_linear_act(x, w, bias, activation)
    return x.new_empty((*x.shape[:-1], w.shape[1]))


def apply_activation(y: Tensor, activation: str) -> Tensor:
    if activation == "relu":
        return F.relu(y)
    if activation == "gelu":
        return F.gelu(y)
    if activation == "gelu_tanh":
        return F.gelu(y, approximate="tanh")
    if activation == "silu":
        return F.silu(y)
    return y


def linear_act_reference(x: Tensor, w: Tensor, bias: Tensor | None = None, activation: str = "none") -> Tensor:
    """The CPU implementation: torch's matmul (with the bias added by addmm), then the activation."""
    check_linear_act(x, w, bias, activation)
    x2d = x.reshape(-1, x.shape[-1])
    y = torch.addmm(bias.to(x.dtype), x2d, w) if bias is not None else x2d @ w
    return apply_activation(y, activation).reshape(*x.shape[:-1], w.shape[1]).contiguous()


# --- Triton -------------------------------------------------------------------------------

_GPU_CONFIGS = [
    {"BLOCK_M": 128, "BLOCK_N": 256, "BLOCK_K": 64, "GROUP_M": 8, "num_warps": 8, "num_stages": 3},
    {"BLOCK_M": 128, "BLOCK_N": 128, "BLOCK_K": 64, "GROUP_M": 8, "num_warps": 8, "num_stages": 4},
    {"BLOCK_M": 128, "BLOCK_N": 128, "BLOCK_K": 32, "GROUP_M": 8, "num_warps": 4, "num_stages": 4},
    {"BLOCK_M": 64, "BLOCK_N": 256, "BLOCK_K": 32, "GROUP_M": 8, "num_warps": 4, "num_stages": 4},
    {"BLOCK_M": 128, "BLOCK_N": 64, "BLOCK_K": 32, "GROUP_M": 8, "num_warps": 4, "num_stages": 4},
    {"BLOCK_M": 64, "BLOCK_N": 128, "BLOCK_K": 32, "GROUP_M": 8, "num_warps": 4, "num_stages": 4},
    {"BLOCK_M": 64, "BLOCK_N": 64, "BLOCK_K": 64, "GROUP_M": 8, "num_warps": 4, "num_stages": 3},
    {"BLOCK_M": 32, "BLOCK_N": 64, "BLOCK_K": 32, "GROUP_M": 8, "num_warps": 2, "num_stages": 5},
]
_INTERPRETER_CONFIG = {"BLOCK_M": 16, "BLOCK_N": 16, "BLOCK_K": 16, "GROUP_M": 2, "num_warps": 4, "num_stages": 1}


@triton.jit
def _activation(y, ACTIVATION: tl.constexpr):
    """The epilogue's activation on an fp32 tile (codes as in ACTIVATIONS)."""
    if ACTIVATION == 1:
        y = tl.maximum(y, 0.0)
    elif ACTIVATION == 2:
        y = 0.5 * y * (1.0 + tl.erf(y * 0.7071067811865476))
    elif ACTIVATION == 3:
        # 0.5 * (1 + tanh(u)) == sigmoid(2u): no tanh needed
        u = 0.7978845608028654 * (y + 0.044715 * y * y * y)
        y = y * tl.sigmoid(2.0 * u)
    elif ACTIVATION == 4:
        y = y * tl.sigmoid(y)
    return y


@triton.autotune(configs=autotune_configs(_GPU_CONFIGS, _INTERPRETER_CONFIG), key=["M", "N", "K"])
@triton.jit
def _linear_act_kernel(
    x_ptr, w_ptr, bias_ptr, out_ptr,
    M, N, K,
    stride_xm, stride_xk, stride_wk, stride_wn, stride_om, stride_on,
    HAS_BIAS: tl.constexpr, ACTIVATION: tl.constexpr, ALLOW_TF32: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr,
):
    # grouped ordering: GROUP_M row-tiles walk the column tiles together (L2 reuse of w)
    pid = tl.program_id(0)
    num_pid_m = tl.cdiv(M, BLOCK_M)
    num_pid_n = tl.cdiv(N, BLOCK_N)
    pids_per_group = GROUP_M * num_pid_n
    first_pid_m = (pid // pids_per_group) * GROUP_M
    group_size_m = tl.minimum(num_pid_m - first_pid_m, GROUP_M)
    pid_m = first_pid_m + ((pid % pids_per_group) % group_size_m)
    pid_n = (pid % pids_per_group) // group_size_m

    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_k = tl.arange(0, BLOCK_K)
    # wrap (not mask) out-of-range rows/columns for the loads: the stores drop them anyway;
    # `% N` keeps Triton's proof that columns are contiguous (vectorised loads of w)
    rows = (offs_m % M).to(tl.int64)
    cols = offs_n % N
    x_ptrs = x_ptr + rows[:, None] * stride_xm + offs_k[None, :] * stride_xk
    w_ptrs = w_ptr + offs_k[:, None] * stride_wk + cols[None, :] * stride_wn

    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k in range(0, tl.cdiv(K, BLOCK_K)):
        k_left = K - k * BLOCK_K
        x_tile = tl.load(x_ptrs, mask=offs_k[None, :] < k_left, other=0.0)
        w_tile = tl.load(w_ptrs, mask=offs_k[:, None] < k_left, other=0.0)
        if ALLOW_TF32:
            acc = tl.dot(x_tile, w_tile, acc, input_precision="tf32")
        else:
            acc = tl.dot(x_tile, w_tile, acc, input_precision="ieee")
        x_ptrs += BLOCK_K * stride_xk
        w_ptrs += BLOCK_K * stride_wk

    if HAS_BIAS:
        acc += tl.load(bias_ptr + offs_n, mask=offs_n < N, other=0.0).to(tl.float32)[None, :]
    acc = _activation(acc, ACTIVATION)
    out_ptrs = out_ptr + offs_m.to(tl.int64)[:, None] * stride_om + offs_n[None, :] * stride_on
    tl.store(out_ptrs, acc.to(out_ptr.dtype.element_ty), mask=(offs_m[:, None] < M) & (offs_n[None, :] < N))


def linear_act_triton(x: Tensor, w: Tensor, bias: Tensor | None = None, activation: str = "none") -> Tensor:
    """Launch the Triton kernel (CUDA tensors, or CPU tensors under TRITON_INTERPRET=1)."""
    from torch.library import wrap_triton

    check_linear_act(x, w, bias, activation)
    k_dim, n_dim = w.shape
    x2d = x.reshape(-1, k_dim)  # a view whenever the leading dims allow it
    m_dim = x2d.shape[0]
    out = torch.empty((m_dim, n_dim), dtype=x.dtype, device=x.device)
    if out.numel() > 0:

        def grid(meta: dict) -> tuple[int]:
            return (triton.cdiv(m_dim, meta["BLOCK_M"]) * triton.cdiv(n_dim, meta["BLOCK_N"]),)

        wrap_triton(_linear_act_kernel)[grid](
            x2d, w, bias if bias is not None else x2d, out,
            m_dim, n_dim, k_dim,
            x2d.stride(0), x2d.stride(1), w.stride(0), w.stride(1), out.stride(0), out.stride(1),
            HAS_BIAS=bias is not None, ACTIVATION=ACTIVATIONS[activation], ALLOW_TF32=dot_precision(x.dtype) == "tf32",
        )
    return out.reshape(*x.shape[:-1], n_dim)
