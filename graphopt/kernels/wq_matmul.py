"""graphopt::wq_linear: ``x @ dequant(W) + bias`` with W quantized weight-only to int8 or int4.

W ``[K, N]`` is stored as graphopt.quant.blockwise makes it (onnxruntime's MatMulNBits layout):

* packed ``[N, k_blocks, block_size * bits // 8]`` uint8, int4 with element 2i in the low
  nibble and 2i+1 in the high one (K padded with zeros to ``k_blocks * block_size``);
* scales ``[N, k_blocks]`` in x's dtype;
* zeros ``[N, k_blocks]`` uint8 (unpacked, one per byte), or None: the symmetric zero point
  ``2**(bits-1)``.

w[k, n] = (q[n, k] - zero[n, k // block]) * scale[n, k // block].

The Triton kernel reads the packed bytes (a quarter of fp16's traffic for int4: decode is
bound by reading weights), unpacks them in registers, and multiplies the integer values
(exact in fp16/bf16) by x with fp32 accumulation; the scale of the quantization block is
applied to each K tile's partial product, since a tile never spans two blocks
(BLOCK_K divides block_size). int4 needs no interleave: the low nibbles meet x's even
columns and the high nibbles its odd ones, two dots per tile.

Two launch shapes of the same kernel: for decode (M <= 16, batch 1-16 at one token) there
are too few output tiles to fill the GPU, so K is split over SPLIT_K programs that write fp32
partial sums (summed after, deterministic, no atomics); for larger M one program per output
tile walks the whole K.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from graphopt.kernels._triton import INTERPRET, dot_precision, tl, triton

__all__ = ["dequantize_weight", "wq_linear_reference", "wq_linear_fake", "wq_linear_triton", "check_wq_linear", "SMALL_M"]

#: Up to this many rows (tokens x batch) the split-K launch is used.
SMALL_M = 16


def check_wq_linear(x: Tensor, packed: Tensor, scales: Tensor, zeros: Tensor | None, bias: Tensor | None,
                    bits: int, block_size: int, k: int) -> None:
    """Shape and dtype rules every implementation shares."""
    torch._check(bits in (4, 8), lambda: f"graphopt::wq_linear: bits must be 4 or 8, not {bits}")
    torch._check(packed.dim() == 3 and packed.dtype == torch.uint8,
                 lambda: f"graphopt::wq_linear: packed must be uint8 [N, k_blocks, bytes]; got {packed.dtype} {tuple(packed.shape)}")
    n, k_blocks = packed.shape[0], packed.shape[1]
    torch._check(packed.shape[2] == block_size * bits // 8, lambda: f"graphopt::wq_linear: packed's last dim must be {block_size * bits // 8}")
    torch._check(k_blocks * block_size >= k > (k_blocks - 1) * block_size, lambda: f"graphopt::wq_linear: K {k} does not fit {k_blocks} blocks of {block_size}")
    torch._check(x.shape[-1] == k, lambda: f"graphopt::wq_linear: x {tuple(x.shape)} must end in K = {k}")
    torch._check(tuple(scales.shape) == (n, k_blocks), lambda: f"graphopt::wq_linear: scales {tuple(scales.shape)} must be [{n}, {k_blocks}]")
    if zeros is not None:
        torch._check(tuple(zeros.shape) == (n, k_blocks), lambda: f"graphopt::wq_linear: zeros {tuple(zeros.shape)} must be [{n}, {k_blocks}]")
    if bias is not None:
        torch._check(tuple(bias.shape) == (n,), lambda: f"graphopt::wq_linear: bias {tuple(bias.shape)} must be [{n}]")


def wq_linear_fake(x: Tensor, packed: Tensor, scales: Tensor, zeros: Tensor | None, bias: Tensor | None,
                   bits: int, block_size: int, k: int) -> Tensor:
    check_wq_linear(x, packed, scales, zeros, bias, bits, block_size, k)
    return x.new_empty((*x.shape[:-1], packed.shape[0]))


def dequantize_weight(packed: Tensor, scales: Tensor, zeros: Tensor | None, bits: int, block_size: int, k: int) -> Tensor:
    """W [K, N] in the scales' dtype (torch ops only: inductor fuses them where it runs this)."""
    n, k_blocks = packed.shape[0], packed.shape[1]
    if bits == 4:
        q = torch.stack([packed & 0x0F, packed >> 4], dim=-1).reshape(n, k_blocks, block_size)
    else:
        q = packed
    zero = zeros.to(scales.dtype)[..., None] if zeros is not None else float(1 << (bits - 1))
    # (q - zero) is an integer of at most 9 bits: exact in fp16 and bf16, so one rounding (the product).
    w = (q.to(scales.dtype) - zero) * scales[..., None]
    return w.reshape(n, k_blocks * block_size)[:, :k].t()


def wq_linear_reference(x: Tensor, packed: Tensor, scales: Tensor, zeros: Tensor | None, bias: Tensor | None,
                        bits: int, block_size: int, k: int) -> Tensor:
    """The CPU implementation (and the "dequant" candidate's meaning): dequantize, then torch's matmul."""
    check_wq_linear(x, packed, scales, zeros, bias, bits, block_size, k)
    w = dequantize_weight(packed, scales.to(x.dtype), zeros, bits, block_size, k)
    return F.linear(x, w.t(), None if bias is None else bias.to(x.dtype))


# --- Triton -------------------------------------------------------------------------------


@triton.jit
def _wq_matmul_kernel(
    x_ptr, w_ptr, s_ptr, z_ptr, b_ptr, out_ptr,
    M, N, K, k_tiles_per_split,
    stride_xm, stride_xk, stride_wn, stride_sn, stride_os, stride_om, stride_on,
    BITS: tl.constexpr, QBLOCK: tl.constexpr, HAS_ZEROS: tl.constexpr, HAS_BIAS: tl.constexpr,
    SPLIT_K: tl.constexpr, ALLOW_TF32: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, BYTES_K: tl.constexpr,
):
    pid_m = tl.program_id(0)
    pid_n = tl.program_id(1)
    pid_k = tl.program_id(2)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    # wrap (not mask) out-of-range rows/columns for the loads: the stores drop them anyway
    rows = (offs_m % M).to(tl.int64)
    cols = (offs_n % N).to(tl.int64)
    # BYTES_K: packed bytes per row of a K tile (BLOCK_K * BITS / 8)
    offs_b = tl.arange(0, BYTES_K)
    k_tiles = tl.cdiv(K, BLOCK_K)
    first = pid_k * k_tiles_per_split
    last = tl.minimum(first + k_tiles_per_split, k_tiles)

    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for t in range(first, last):
        k0 = t * BLOCK_K
        block = k0 // QBLOCK  # a tile lies inside one quantization block
        scale = tl.load(s_ptr + cols * stride_sn + block).to(tl.float32)
        if HAS_ZEROS:
            zero = tl.load(z_ptr + cols * stride_sn + block).to(tl.float32)
        else:
            zero = tl.zeros((BLOCK_N,), dtype=tl.float32) + (1 << (BITS - 1))
        # [BYTES_K, BLOCK_N]: the bytes of the tile, K down, N across (always in bounds: K is padded)
        raw = tl.load(w_ptr + cols[None, :] * stride_wn + (k0 * BITS // 8 + offs_b)[:, None])
        if BITS == 4:
            lo = ((raw & 0x0F).to(tl.float32) - zero[None, :]).to(x_ptr.dtype.element_ty)
            hi = ((raw >> 4).to(tl.float32) - zero[None, :]).to(x_ptr.dtype.element_ty)
            k_even = k0 + 2 * offs_b
            x_row = x_ptr + rows[:, None] * stride_xm
            x_even = tl.load(x_row + k_even[None, :] * stride_xk, mask=k_even[None, :] < K, other=0.0)
            x_odd = tl.load(x_row + (k_even + 1)[None, :] * stride_xk, mask=(k_even + 1)[None, :] < K, other=0.0)
            if ALLOW_TF32:
                part = tl.dot(x_even, lo, input_precision="tf32")
                part = tl.dot(x_odd, hi, part, input_precision="tf32")
            else:
                part = tl.dot(x_even, lo, input_precision="ieee")
                part = tl.dot(x_odd, hi, part, input_precision="ieee")
        else:
            w = (raw.to(tl.float32) - zero[None, :]).to(x_ptr.dtype.element_ty)
            ks = k0 + offs_b
            x_tile = tl.load(x_ptr + rows[:, None] * stride_xm + ks[None, :] * stride_xk, mask=ks[None, :] < K, other=0.0)
            if ALLOW_TF32:
                part = tl.dot(x_tile, w, input_precision="tf32")
            else:
                part = tl.dot(x_tile, w, input_precision="ieee")
        acc += part * scale[None, :]

    mask = (offs_m[:, None] < M) & (offs_n[None, :] < N)
    out_ptrs = out_ptr + pid_k * stride_os + offs_m.to(tl.int64)[:, None] * stride_om + offs_n[None, :] * stride_on
    if SPLIT_K == 1:
        if HAS_BIAS:
            acc += tl.load(b_ptr + offs_n, mask=offs_n < N, other=0.0).to(tl.float32)[None, :]
        tl.store(out_ptrs, acc.to(out_ptr.dtype.element_ty), mask=mask)
    else:  # fp32 partial sums, one slice per split
        tl.store(out_ptrs, acc, mask=mask)


def _multiprocessors(device: torch.device) -> int:
    if device.type == "cuda":
        return torch.cuda.get_device_properties(device).multi_processor_count
    return 4  # the interpreter: a few programs are enough to exercise the split


def launch_config(m: int, n: int, k: int, block_size: int, bits: int, device: torch.device,
                  split_k: int | None = None) -> dict[str, int]:
    """Tiles and split for one shape: split-K for small M, one program per tile otherwise."""
    if INTERPRET:  # numpy runs every program: small tiles, still several of them
        config = {"BLOCK_M": 16, "BLOCK_N": 16, "BLOCK_K": 32, "num_warps": 4, "num_stages": 1}
    elif m <= SMALL_M:
        config = {"BLOCK_M": 16, "BLOCK_N": 64, "BLOCK_K": min(block_size, 128), "num_warps": 4, "num_stages": 4}
    else:
        config = {"BLOCK_M": 64 if m <= 64 else 128, "BLOCK_N": 128, "BLOCK_K": min(block_size, 64), "num_warps": 8 if m > 64 else 4,
                  "num_stages": 3}
    # the int4 dots see half the tile each: tl.dot needs at least 16 along K
    config["BLOCK_K"] = max(config["BLOCK_K"], 32 if bits == 4 else 16)
    k_tiles = -(-k // config["BLOCK_K"])
    if split_k is None:
        split_k = 1
        if m <= SMALL_M:
            tiles = -(-m // config["BLOCK_M"]) * -(-n // config["BLOCK_N"])
            split_k = max(1, min(k_tiles, (2 * _multiprocessors(device)) // max(tiles, 1)))
    per_split = -(-k_tiles // max(1, split_k))
    config["SPLIT_K"] = -(-k_tiles // per_split)  # no empty split
    config["k_tiles_per_split"] = per_split
    return config


def wq_linear_triton(x: Tensor, packed: Tensor, scales: Tensor, zeros: Tensor | None, bias: Tensor | None,
                     bits: int, block_size: int, k: int, split_k: int | None = None) -> Tensor:
    """Launch the Triton kernel (CUDA tensors, or CPU tensors under TRITON_INTERPRET=1); `split_k`
    forces a split (tests), None picks one from the shape."""
    from torch.library import wrap_triton

    check_wq_linear(x, packed, scales, zeros, bias, bits, block_size, k)
    n = packed.shape[0]
    x2d = x.reshape(-1, k)
    m = x2d.shape[0]
    config = launch_config(m, n, k, block_size, bits, x.device, split_k)
    if block_size % config["BLOCK_K"]:
        raise ValueError(f"graphopt::wq_linear: a K tile of {config['BLOCK_K']} must lie inside a block of {block_size}")
    split = config.pop("SPLIT_K")
    per_split = config.pop("k_tiles_per_split")
    out = torch.empty((m, n), dtype=x.dtype, device=x.device)
    if m == 0 or n == 0:
        return out.reshape(*x.shape[:-1], n)
    target = out if split == 1 else torch.empty((split, m, n), dtype=torch.float32, device=x.device)
    scales = scales.to(x.dtype)
    grid = (triton.cdiv(m, config["BLOCK_M"]), triton.cdiv(n, config["BLOCK_N"]), split)
    wrap_triton(_wq_matmul_kernel)[grid](
        x2d, packed, scales, zeros if zeros is not None else packed, bias if bias is not None else scales, target,
        m, n, k, per_split,
        x2d.stride(0), x2d.stride(1), packed.stride(0), scales.stride(0),
        target.stride(0) if split > 1 else 0, target.stride(-2), target.stride(-1),
        BITS=bits, QBLOCK=block_size, HAS_ZEROS=zeros is not None, HAS_BIAS=bias is not None,
        SPLIT_K=split, ALLOW_TF32=dot_precision(x.dtype) == "tf32", BYTES_K=config["BLOCK_K"] * bits // 8, **config,
    )
    if split > 1:
        summed = target.sum(0)
        if bias is not None:
            summed = summed + bias.float()
        out = summed.to(x.dtype)
    return out.reshape(*x.shape[:-1], n)
