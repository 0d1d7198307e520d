"""graphopt::wq_linear: ``x @ dequant(W) + bias`` with W quantized weight-only to int8 or int4.

W ``[K, N]`` is stored as graphopt.quant.blockwise makes it (onnxruntime's MatMulNBits layout):

* packed ``[N, k_blocks, block_size * bits // 8]`` uint8, int4 with element 2i in the low
  nibble and 2i+1 in the high one (K padded with zeros to ``k_blocks * block_size``);
* scales ``[N, k_blocks]`` in x's dtype;
* zeros ``[N, k_blocks]`` uint8 (unpacked, one per byte), or None: the symmetric zero point
  ``2**(bits-1)``.

w[k, n] = (q[n, k] - zero[n, k // block]) * scale[n, k // block].

That layout is already the one a weight-streaming kernel wants: each output column's K
values are one contiguous row of bytes (N-major), so the kernel reads them as int32 words
(8 nibbles or 4 bytes each, little-endian: word j holds elements PER_WORD*j .. in order) in
wide vector loads and unpacks them in registers with shifts.

wq_linear_triton runs graphopt.kernels.wq_gemv's decode GEMV up to wq_gemv.GEMV_MAX_M rows (16)
and this module's kernel beyond; kernel="tiled" forces this one at any M (the kernel benchmark's
old regime). This module's kernel has three regimes (each its own autotuner, keyed on the shape):

* M = 1 (decode at batch 1): a GEMV bound by reading the packed weights. A program owns
  BLOCK_N output columns and walks its slice of K in BLOCK_K tiles, multiplying the integer
  values by x in fp32 and summing per quantization block; the block's scale (and zero point,
  as ``zero * sum(x)``) is applied once per block, not per element. A dot-based config
  (BLOCK_M 16, one row used) competes in the same autotuner.
* M = 2..16 (decode at batch 2-16): the tile is dequantized into x's dtype and fed to tl.dot
  with BLOCK_M 16.
* M > 16 (prefill): the same dequantize-into-tl.dot GEMM with larger tiles.

Split-K, for shapes with too few output tiles to fill the GPU (narrow N), is chosen per
shape outside the autotuner (it needs a zeroed lock per tile): each split stores its fp32
partial sums, and the last program to arrive at a tile (an atomic counter) adds the partials
in split order (deterministic), adds the bias, writes the output and resets the counter:
one launch, no second reduction kernel.
"""

from __future__ import annotations

import functools
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor

from graphopt.kernels._triton import autotune_configs, dot_precision, m_bucket, multiprocessors, tl, triton

__all__ = ["dequantize_weight", "wq_linear_reference", "wq_linear_fake", "wq_linear_triton", "check_wq_linear", "SMALL_M",
           "values_from_words", "GEMV_CONFIGS", "SMALL_M_CONFIGS", "PREFILL_CONFIGS", "split_for", "regime", "m_bucket"]

#: Up to this many rows (tokens x batch) the decode configs (and split-K) are used.
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


def values_from_words(packed: Tensor, bits: int) -> Tensor:
    """The kernel's reading of packed [N, k_blocks, bytes] as int32 words, in torch (for tests):
    value PER_WORD * j + i of a row is bits [i * bits, (i + 1) * bits) of word j (little-endian)."""
    per_word = 32 // bits
    words = packed.contiguous().reshape(packed.shape[0], -1).view(torch.int32)
    shifts = torch.arange(per_word, dtype=torch.int32, device=packed.device) * bits
    values = (words[:, :, None] >> shifts) & ((1 << bits) - 1)
    return values.reshape(packed.shape[0], packed.shape[1], -1).to(torch.uint8)


# --- Triton -------------------------------------------------------------------------------


@triton.jit
def _unpack_scaled(words, BITS: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, OFFSET: tl.constexpr):
    """[BLOCK_N, BLOCK_K // (32 // BITS)] int32 words -> [BLOCK_N, BLOCK_K] fp32, in K order:
    value k is (q - OFFSET) * 2**(BITS * (k % P)), P = 16 // BITS (4 for int4, 2 for int8), exact.

    No shift per value: a value is masked where it lies in the word (its lower or upper half:
    one shift per word), ORed into the mantissa of 2**23, and the float minus
    2**23 + OFFSET * 2**(BITS * (k % P)) (one LOP3 and one FADD per value; OFFSET is the
    symmetric zero point, 0 with zero points). The caller takes the power of two out per class
    of k % P: the GEMV from its per-class sums, the dot path with the scale (both exact).

    The values of a word stay in the thread that loaded it: nested tl.join puts each new axis
    inside the thread, ordered so that the row-major reshape reads value i of word j at
    8j + i (int4) / 4j + i (int8).
    """
    MAGIC: tl.constexpr = 0x4B000000  # 2**23 as fp32 bits
    low = words
    high = words >> 16
    if BITS == 4:
        v0 = ((low & 0x000F) | MAGIC).to(tl.float32, bitcast=True) - (8388608.0 + OFFSET)
        v1 = ((low & 0x00F0) | MAGIC).to(tl.float32, bitcast=True) - (8388608.0 + OFFSET * 16)
        v2 = ((low & 0x0F00) | MAGIC).to(tl.float32, bitcast=True) - (8388608.0 + OFFSET * 256)
        v3 = ((low & 0xF000) | MAGIC).to(tl.float32, bitcast=True) - (8388608.0 + OFFSET * 4096)
        v4 = ((high & 0x000F) | MAGIC).to(tl.float32, bitcast=True) - (8388608.0 + OFFSET)
        v5 = ((high & 0x00F0) | MAGIC).to(tl.float32, bitcast=True) - (8388608.0 + OFFSET * 16)
        v6 = ((high & 0x0F00) | MAGIC).to(tl.float32, bitcast=True) - (8388608.0 + OFFSET * 256)
        v7 = ((high & 0xF000) | MAGIC).to(tl.float32, bitcast=True) - (8388608.0 + OFFSET * 4096)
        joined = tl.join(tl.join(tl.join(v0, v4), tl.join(v2, v6)), tl.join(tl.join(v1, v5), tl.join(v3, v7)))
    else:
        v0 = ((low & 0x00FF) | MAGIC).to(tl.float32, bitcast=True) - (8388608.0 + OFFSET)
        v1 = ((low & 0xFF00) | MAGIC).to(tl.float32, bitcast=True) - (8388608.0 + OFFSET * 256)
        v2 = ((high & 0x00FF) | MAGIC).to(tl.float32, bitcast=True) - (8388608.0 + OFFSET)
        v3 = ((high & 0xFF00) | MAGIC).to(tl.float32, bitcast=True) - (8388608.0 + OFFSET * 256)
        joined = tl.join(tl.join(v0, v2), tl.join(v1, v3))
    return tl.reshape(joined, (BLOCK_N, BLOCK_K))


@triton.jit
def _wq_kernel(
    x_ptr, w_ptr, s_ptr, z_ptr, b_ptr, out_ptr, part_ptr, lock_ptr,
    M, N, K, KP, KW, KB, M_BUCKET,
    stride_xm, stride_xk, stride_ww, stride_sn, stride_om,
    BITS: tl.constexpr, QBLOCK: tl.constexpr, HAS_ZEROS: tl.constexpr, HAS_BIAS: tl.constexpr,
    SPLIT_K: tl.constexpr, ALLOW_TF32: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, STAGES: tl.constexpr,
):
    # M_BUCKET: only the autotuners' key. KP: K padded to whole blocks (the packed row's length),
    # KW its words, KB its blocks (arguments, not divisions here: Triton then knows their
    # divisibility, and a mask as divisible as the words keeps the loads 16 bytes wide).
    # STAGES: the K loop's software pipelining depth (num_stages alone pipelines only loops with a dot).
    PER_WORD: tl.constexpr = 32 // BITS  # values in one int32 word
    WORDS: tl.constexpr = BLOCK_K // PER_WORD  # words of a row in one K tile
    GROUPS: tl.constexpr = (BLOCK_K + QBLOCK - 1) // QBLOCK  # quantization blocks in a K tile (1 if the tile is smaller)
    GROUP_K: tl.constexpr = BLOCK_K // GROUPS
    pid_n = tl.program_id(0)
    pid_k = tl.program_id(1)
    pid_m = tl.program_id(2)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    # wrap (not mask) out-of-range rows/columns for the loads: the stores drop them anyway
    cols = (offs_n % N).to(tl.int64)
    rows = (offs_m % M).to(tl.int64)
    words_ptr = w_ptr.to(tl.pointer_type(tl.int32))  # rows of KP // PER_WORD words, stride_ww words apart
    word = tl.arange(0, WORDS)
    PERIOD: tl.constexpr = 16 // BITS  # the GEMV's values carry 2**(BITS * (k % PERIOD)) (_unpack_scaled)
    unscale = ((127 - BITS * tl.arange(0, PERIOD)) << 23).to(tl.float32, bitcast=True)  # 2**-(BITS * c), exact
    group = tl.arange(0, GROUPS)
    k_tiles = tl.cdiv(KP, BLOCK_K)
    per_split = tl.cdiv(k_tiles, SPLIT_K)
    first = pid_k * per_split
    last = tl.minimum(first + per_split, k_tiles)

    if BLOCK_M == 1:
        acc = tl.zeros((BLOCK_N, GROUPS), dtype=tl.float32)  # per block slot: one cross-thread sum, after the loop
    else:
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for t in tl.range(first, last, num_stages=STAGES):
        k0 = t * BLOCK_K
        wk = k0 // PER_WORD + word
        words = tl.load(words_ptr + cols[:, None] * stride_ww + wk[None, :], mask=(wk < KW)[None, :], other=0)
        blk = k0 // QBLOCK + group
        s_offs = cols[:, None] * stride_sn + blk[None, :]
        scale = tl.load(s_ptr + s_offs, mask=(blk < KB)[None, :], other=0.0).to(tl.float32)  # [BN, G]
        kk = k0 + tl.arange(0, BLOCK_K)
        if BLOCK_M == 1:
            # GEMV: sum_k (q - z) s x = s * (sum_k q x - z * sum_k x), per block (z folded into q when symmetric)
            xk = tl.load(x_ptr + pid_m * stride_xm + kk * stride_xk, mask=kk < K, other=0.0).to(tl.float32)
            # [BN, BK] fp32, exact: (q - z) * 2**(BITS * (k % PERIOD)), z the symmetric 2**(bits-1) or 0 with zero points
            v = _unpack_scaled(words, BITS, BLOCK_N, BLOCK_K, 0 if HAS_ZEROS else (1 << (BITS - 1)))
            by_class = tl.sum(tl.reshape(v * xk[None, :], (BLOCK_N, GROUPS, GROUP_K // PERIOD, PERIOD)), axis=2)
            qx = tl.sum(by_class * unscale[None, None, :], axis=2)  # [BN, G]
            if HAS_ZEROS:
                zero = tl.load(z_ptr + s_offs, mask=(blk < KB)[None, :], other=0).to(tl.float32)
                qx -= zero * tl.sum(tl.reshape(xk, (GROUPS, GROUP_K)), axis=1)[None, :]
            acc += qx * scale
        else:
            # the reference's rounding: (q - z) * s, exact in fp32 (products of <= 9 and 11 significant
            # bits, powers of two), rounded once to x's dtype
            v = _unpack_scaled(words, BITS, BLOCK_N, BLOCK_K, 0 if HAS_ZEROS else (1 << (BITS - 1)))
            v = tl.reshape(v, (BLOCK_N, GROUPS, GROUP_K // PERIOD, PERIOD))
            class_scale = (scale[:, :, None] * unscale[None, None, :])[:, :, None, :]  # s * 2**-(BITS * c)
            if HAS_ZEROS:
                zero = tl.load(z_ptr + s_offs, mask=(blk < KB)[None, :], other=0).to(tl.float32)
                w = v * class_scale - (zero * scale)[:, :, None, None]  # q s - z s
            else:
                w = v * class_scale
            w = tl.reshape(w.to(x_ptr.dtype.element_ty), (BLOCK_N, BLOCK_K))
            x_tile = tl.load(x_ptr + rows[:, None] * stride_xm + kk[None, :] * stride_xk, mask=kk[None, :] < K, other=0.0)
            if ALLOW_TF32:
                acc = tl.dot(x_tile, tl.trans(w), acc, input_precision="tf32")
            else:
                acc = tl.dot(x_tile, tl.trans(w), acc, input_precision="ieee")

    if BLOCK_M == 1:
        result = tl.sum(acc, axis=1)[None, :]
    else:
        result = acc
    mask = (offs_m[:, None] < M) & (offs_n[None, :] < N)
    out_ptrs = out_ptr + offs_m.to(tl.int64)[:, None] * stride_om + offs_n[None, :]
    if HAS_BIAS:
        bias = tl.load(b_ptr + offs_n, mask=offs_n < N, other=0.0).to(tl.float32)[None, :]
    if SPLIT_K == 1:
        if HAS_BIAS:
            result += bias
        tl.store(out_ptrs, result.to(out_ptr.dtype.element_ty), mask=mask)
    else:
        # partials [SPLIT_K, M, N] fp32; the last program of the tile sums them in split order
        part_ptrs = part_ptr + offs_m.to(tl.int64)[:, None] * N + offs_n[None, :]
        tl.store(part_ptrs + pid_k * M * N, result, mask=mask)
        tl.debug_barrier()  # every thread's partial stored before the (release) count
        tile = pid_m * tl.num_programs(0) + pid_n
        arrived = tl.atomic_add(lock_ptr + tile, 1, sem="acq_rel")
        if arrived == SPLIT_K - 1:
            total = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
            for split in tl.static_range(SPLIT_K):
                total += tl.load(part_ptrs + split * M * N, mask=mask, other=0.0, cache_modifier=".cg")
            if HAS_BIAS:
                total += bias
            tl.store(out_ptrs, total.to(out_ptr.dtype.element_ty), mask=mask)
            tl.atomic_xchg(lock_ptr + tile, 0)  # ready for the next launch (autotuning reuses the lock)


def _configs(entries: list[tuple[int, int, int, int, int]]) -> list[dict[str, int]]:
    return [{"BLOCK_M": bm, "BLOCK_N": bn, "BLOCK_K": bk, "STAGES": stages, "num_warps": warps, "num_stages": stages}
            for bm, bn, bk, warps, stages in entries]


# (BLOCK_M, BLOCK_N, BLOCK_K, num_warps, num_stages). M = 1: the GEMV (BLOCK_M 1) against two dot configs.
GEMV_CONFIGS = _configs([
    (1, 4, 1024, 4, 3), (1, 8, 512, 4, 2), (1, 8, 1024, 4, 2), (1, 16, 256, 4, 3), (1, 16, 512, 4, 2), (1, 16, 512, 8, 3),
    (1, 16, 1024, 8, 2), (1, 32, 256, 4, 3), (1, 32, 512, 8, 2), (1, 64, 128, 4, 4), (1, 64, 256, 8, 3),
    (16, 32, 128, 4, 3), (16, 64, 128, 4, 3),
])
SMALL_M_CONFIGS = _configs([
    (16, 16, 256, 4, 3), (16, 16, 512, 4, 2), (16, 32, 128, 4, 3), (16, 32, 256, 4, 3), (16, 32, 512, 8, 2),
    (16, 64, 128, 4, 3), (16, 64, 256, 8, 3), (16, 128, 128, 8, 3),
])
PREFILL_CONFIGS = _configs([
    (64, 64, 64, 4, 3), (64, 128, 64, 4, 3), (64, 128, 128, 8, 3), (128, 64, 64, 4, 4), (64, 64, 128, 8, 3),
    (128, 128, 64, 8, 3),
])
_FINEST_BLOCK_N = min(c["BLOCK_N"] for c in GEMV_CONFIGS + SMALL_M_CONFIGS + PREFILL_CONFIGS + [{"BLOCK_N": 16}])
#: Under the interpreter: one small config per regime (tests pass others explicitly).
_INTERPRETER = {"gemv": {"BLOCK_M": 1, "BLOCK_N": 16, "BLOCK_K": 64, "STAGES": 1},
                "small": {"BLOCK_M": 16, "BLOCK_N": 16, "BLOCK_K": 32, "STAGES": 1},
                "prefill": {"BLOCK_M": 16, "BLOCK_N": 16, "BLOCK_K": 32, "STAGES": 1}}
_AUTOTUNE_KEY = ["M_BUCKET", "N", "K", "BITS", "QBLOCK", "HAS_ZEROS", "HAS_BIAS", "SPLIT_K"]


def _bench(fn: Any, quantiles: Any = None) -> Any:
    """Triton's benchmark (L2 flushed before each call: decode streams weights from HBM), shorter."""
    import triton.testing

    return triton.testing.do_bench(fn, warmup=10, rep=40, quantiles=quantiles)


def _tuned(configs: list[dict[str, int]], interpreter: dict[str, int]) -> Any:
    return triton.autotune(configs=autotune_configs(configs, {**interpreter, "num_warps": 4, "num_stages": 1}),
                           key=_AUTOTUNE_KEY, do_bench=_bench)(_wq_kernel)


_TUNED = {"gemv": _tuned(GEMV_CONFIGS, _INTERPRETER["gemv"]), "small": _tuned(SMALL_M_CONFIGS, _INTERPRETER["small"]),
          "prefill": _tuned(PREFILL_CONFIGS, _INTERPRETER["prefill"])}


def regime(m: int) -> str:
    return "gemv" if m == 1 else "small" if m <= SMALL_M else "prefill"


def split_for(m: int, n: int, k_padded: int, device: torch.device) -> int:
    """Split-K for decode shapes whose output tiles (at 16 columns) leave SMs idle; at least
    512 of K per split, at most 8 splits; 1 (no lock, no partials) otherwise."""
    if m > SMALL_M:
        return 1
    tiles = -(-n // 16)  # at M <= 16 one row tile (or, at M = 1, one row)
    sms = multiprocessors(device)
    if tiles >= sms:
        return 1
    return max(1, min(8, -(-sms // tiles), k_padded // 512))


#: Per decode shape (M <= wq_gemv.GEMV_MAX_M, N, K, bits, block, zero points?, bias?, x dtype, device):
#: the kernel measured faster on real CUDA tensors, "gemv" (graphopt.kernels.wq_gemv) or "tiled" (this
#: module's). Neither wins everywhere: on an H200 at M = 1 the GEMV took TinyLlama's o_proj in 5.0 us
#: against 11.0, its qkv in 6.6 against 4.2 (benchmarks/RESULTS.md, session 8).
DECODE_KERNEL: dict[tuple[Any, ...], str] = {}


def _decode_kernel(x: Tensor, packed: Tensor, scales: Tensor, zeros: Tensor | None, bias: Tensor | None,
                   bits: int, block_size: int, k: int) -> str:
    """Which kernel runs this decode shape: the remembered verdict; else, on real CUDA tensors and
    outside a CUDA-graph capture, both timed (each autotuned first; GPU time of a CUDA-graph replay,
    L2 flushed: graphopt.kernels.gpu_timing) and the faster remembered; else the GEMV."""
    from torch._subclasses.fake_tensor import is_fake

    m = x.numel() // k if k else 0
    key = (m, packed.shape[0], k, bits, block_size, zeros is not None, bias is not None, x.dtype, str(x.device))
    found = DECODE_KERNEL.get(key)
    if found is not None:
        return found
    if is_fake(x) or x.device.type != "cuda" or torch.cuda.is_current_stream_capturing():
        return "gemv"
    from graphopt.kernels.gpu_timing import gpu_time_ms

    times = {kernel: gpu_time_ms(functools.partial(wq_linear_triton, x, packed, scales, zeros, bias, bits, block_size, k, kernel=kernel))
             for kernel in ("gemv", "tiled")}
    DECODE_KERNEL[key] = min(times, key=lambda kernel: times[kernel])
    return DECODE_KERNEL[key]


def wq_linear_triton(x: Tensor, packed: Tensor, scales: Tensor, zeros: Tensor | None, bias: Tensor | None,
                     bits: int, block_size: int, k: int, split_k: int | None = None,
                     config: dict[str, int] | None = None, kernel: str = "auto") -> Tensor:
    """Launch a Triton kernel (CUDA tensors, or CPU tensors under TRITON_INTERPRET=1): up to
    wq_gemv.GEMV_MAX_M rows the decode GEMV (graphopt.kernels.wq_gemv) or the tiled kernel here,
    whichever was measured faster for the shape (`DECODE_KERNEL`), else the tiled kernel.
    `kernel` "tiled" forces this module's kernel at any M (its M = 1 GEMV and M <= 16 dot configs:
    the kernel benchmark's old regime), "gemv" the decode GEMV. `split_k` forces a split and `config` a launch config of the
    chosen kernel (tests and the kernel benchmark; a config with K_WORDS is the decode GEMV's);
    None picks them (the split from the shape, the tiles by autotuning keyed on the shape)."""
    from torch.library import wrap_triton

    from graphopt.kernels.wq_gemv import GEMV_MAX_M, wq_gemv_triton

    check_wq_linear(x, packed, scales, zeros, bias, bits, block_size, k)
    n, k_blocks = packed.shape[0], packed.shape[1]
    k_padded = k_blocks * block_size
    x2d = x.reshape(-1, k)
    m = x2d.shape[0]
    if kernel not in ("auto", "tiled", "gemv"):
        raise ValueError(f"graphopt::wq_linear: kernel is auto, tiled or gemv, not {kernel!r}")
    if kernel == "auto" and 1 <= m <= GEMV_MAX_M and split_k is None:
        kernel = "gemv" if config is not None and "K_WORDS" in config else "tiled" if config is not None else \
            _decode_kernel(x, packed, scales, zeros, bias, bits, block_size, k)
    if kernel == "gemv":
        return wq_gemv_triton(x, packed, scales, zeros, bias, bits, block_size, k, config=config)
    if packed.stride(2) != 1 or packed.stride(1) != packed.shape[2] or packed.stride(0) % 4 or packed.storage_offset() % 4:
        packed = packed.contiguous()  # the kernel reads each row as int32 words
    out = torch.empty((m, n), dtype=x.dtype, device=x.device)
    if m == 0 or n == 0:
        return out.reshape(*x.shape[:-1], n)
    split = split_for(m, n, k_padded, x.device) if split_k is None else max(1, int(split_k))
    if split > 1:
        partials = torch.empty((split, m, n), dtype=torch.float32, device=x.device)
        finest = config["BLOCK_N"] if config is not None else _FINEST_BLOCK_N
        locks = torch.zeros((-(-n // finest) * m,), dtype=torch.int32, device=x.device)  # a counter per tile of any config
    else:
        partials, locks = scales, scales  # never touched at SPLIT_K 1: a read-only stand-in (not out: no aliased outputs for inductor)
    scales = scales.to(x.dtype)
    args = (x2d, packed, scales, zeros if zeros is not None else packed, bias if bias is not None else scales, out, partials, locks,
            m, n, k, k_padded, k_padded * bits // 32, k_blocks, m_bucket(m),
            x2d.stride(0), x2d.stride(1), packed.stride(0) // 4, scales.stride(0), out.stride(0))
    meta = dict(BITS=bits, QBLOCK=block_size, HAS_ZEROS=zeros is not None, HAS_BIAS=bias is not None, SPLIT_K=split,
                ALLOW_TF32=dot_precision(x.dtype) == "tf32")

    def grid(meta: dict[str, Any]) -> tuple[int, int, int]:
        return (triton.cdiv(n, meta["BLOCK_N"]), split, triton.cdiv(m, meta["BLOCK_M"]))

    if config is not None:
        launch = dict(config)
        launch.setdefault("STAGES", launch.get("num_stages", 1))
        if launch["BLOCK_M"] == 1 and m != 1:
            raise ValueError("graphopt::wq_linear: the GEMV config (BLOCK_M 1) is for one row")
        grid_fixed = grid(launch)
        wrap_triton(_wq_kernel)[grid_fixed](*args, **meta, **launch)
    else:
        wrap_triton(_TUNED[regime(m)])[grid](*args, **meta)
    return out.reshape(*x.shape[:-1], n)
