"""graphopt::wq_linear's decode regime (M <= 16 rows): a GEMV on CUDA cores that streams the packed weights.

Same operands and packed layout as graphopt.kernels.wq_matmul (MatMulNBits': packed
``[N, k_blocks, block * bits / 8]`` uint8, scales ``[N, k_blocks]``, zero points or the symmetric
``2**(bits-1)``); no repack. Read as int32 words, a quantization block is WPB = block * bits / 32
consecutive words of a row, so a K tile of a program is a ``[BLOCK_N, BLOCKS, WPB]`` tensor of
words loaded 16 bytes at a time, and the block's scale broadcasts over its WPB words.

At one row a GEMV does ~2 useful operations per weight (unpack, multiply-add); at an H200's 4.8 TB/s
an int4 weight arrives every ~0.8 ps per SM-lane, so the instructions per weight decide whether the
kernel streams at bandwidth. Per int4 word (8 values) this kernel spends one shift, then per value
one LOP3 (mask the value where it lies) and one FFMA:

* the masked int32 ``q << b`` (b its bit offset, < 23) read as fp32 is the subnormal ``q * 2**(b-149)``;
  x is pre-scaled once per tile by ``2**(149 - b - E)`` (E = 64), so the FFMA adds ``q * x * 2**-E``
  exactly (no int->float conversion, no magic-number subtraction; FFMA keeps subnormals: Triton
  compiles without flush-to-zero);
* the zero point comes off per word, ``sum((q - z) x) = sum(q x) - z * sum(x)`` (sum(x) per word
  once per tile, shared by every output column), and the scale multiplies per word: 2 FFMA per word;
* the result is scaled back by ``2**E`` once per output (exact). Exact for |x| < 2**43 and
  |x * scale| > 2**-60 (fp16 activations always; bf16/fp32 beyond that range lose precision).

With several rows (M = 2..16) the multiply-adds are M per value, so the per-word work of one row
would cost M times: instead the value is multiplied by its block's scale once (the subnormal times
``s * 2**100`` is ``q * s * 2**(shift - 49)``, normal and exact for 2**-77 < s < 2**27), shared by
the rows, and each row's FFMA takes x scaled by ``2**(49 - shift)``; the zero point comes off per
word and row. On CUDA cores this costs ~M FFMA a value, so at M = 16 the kernel is bound by
arithmetic, not by the weights' bytes (compare with the tiled tl.dot kernel in the benchmark).

Each program owns BLOCK_N output columns (rows of the packed weight) and all M rows of x (BLOCK_M
= M rounded up to a power of two, masked): the unpacked weights are reused for every row. The
products accumulate per (row, column, word slot) in registers and are reduced across threads once,
at the end (no shuffles in the K loop). Which thread holds which words is Triton's layout choice: the
K loop's copies go through shared memory (num_stages), so loads stay 16 bytes wide whatever it picks.

Split-K (SPLIT_K > 1, a config of the autotuner, offered only for shapes with few column tiles):
each split stores fp32 partials; the last program to arrive at a tile (an atomic counter) adds
them in split order (deterministic), adds the bias, writes and resets the counter (wq_matmul's scheme).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from graphopt.kernels._triton import autotune_configs, multiprocessors, next_power_of_2, tl, triton

__all__ = ["GEMV_MAX_M", "DECODE_CONFIGS", "ONE_ROW_CONFIGS", "SPLIT_CONFIGS", "DECODE_SPLIT_CONFIGS", "wq_gemv_triton", "splits_offered", "configs_for", "CHOSEN"]

#: Up to this many rows wq_linear runs this kernel (more: wq_matmul's tiled kernels).
GEMV_MAX_M = 16


@triton.jit
def _wq_gemv_kernel(
    x_ptr, w_ptr, s_ptr, z_ptr, b_ptr, out_ptr, part_ptr, lock_ptr,
    M, N, K, KB, M_KEY,
    stride_xm, stride_ww, stride_sn, stride_om,
    BITS: tl.constexpr, QBLOCK: tl.constexpr, HAS_ZEROS: tl.constexpr, HAS_BIAS: tl.constexpr, BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr, K_WORDS: tl.constexpr, SPLIT_K: tl.constexpr, STAGES: tl.constexpr,
):
    # M_KEY: only the autotuner's key. KB: quantization blocks per row (a packed row is KB * WPB words).
    PER_WORD: tl.constexpr = 32 // BITS  # values in an int32 word
    WPB: tl.constexpr = QBLOCK // PER_WORD  # words in a quantization block
    BLOCKS: tl.constexpr = (K_WORDS + WPB - 1) // WPB  # quantization blocks per K tile (>= 1)
    pid_n = tl.program_id(0)
    pid_k = tl.program_id(1)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    cols = (offs_n % N).to(tl.int64)  # wrapped for the loads; the stores drop them
    offs_m = tl.arange(0, BLOCK_M)
    row_ok = offs_m < M
    g = tl.arange(0, BLOCKS)
    w = tl.arange(0, WPB)
    words_ptr = w_ptr.to(tl.pointer_type(tl.int32))
    w_rows = words_ptr + cols[:, None, None] * stride_ww  # [BN, 1, 1]
    s_rows = s_ptr + cols[:, None] * stride_sn  # [BN, 1]
    x_rows = x_ptr + offs_m[:, None, None].to(tl.int64) * stride_xm  # [BM, 1, 1]
    tiles = tl.cdiv(KB, BLOCKS)
    per_split = tl.cdiv(tiles, SPLIT_K)
    first = pid_k * per_split
    last = tl.minimum(first + per_split, tiles)
    acc = tl.zeros((BLOCK_M, BLOCK_N, BLOCKS, WPB), dtype=tl.float32)  # per word slot, reduced once at the end
    for t in tl.range(first, last, num_stages=STAGES):
        blk = t * BLOCKS + g  # [G]
        blk_ok = blk < KB
        wk = blk[:, None] * WPB + w[None, :]  # [G, WPB] word index in the row
        words = tl.load(w_rows + wk[None, :, :], mask=blk_ok[None, :, None], other=0)  # [BN, G, WPB] int32
        scale = tl.load(s_rows + blk[None, :], mask=blk_ok[None, :], other=0.0).to(tl.float32)  # [BN, G]
        if HAS_ZEROS:
            zero = tl.load(z_ptr + cols[:, None] * stride_sn + blk[None, :], mask=blk_ok[None, :], other=0).to(tl.float32)
        else:
            zero = tl.full((BLOCK_N, BLOCKS), 1 << (BITS - 1), tl.float32)
        high = words >> 16  # the values at bits >= 16 (bit 23 would be the exponent's)
        k_first = wk * PER_WORD  # [G, WPB] k of each word's first value
        x_sum = tl.zeros((BLOCK_M, BLOCKS, WPB), dtype=tl.float32)
        if BLOCK_M == 1:
            # one row: an FFMA a value (q * x * 2**-E, x scaled by 2**(149 - E - shift)); zero point and scale once a word
            qx = tl.zeros((BLOCK_M, BLOCK_N, BLOCKS, WPB), dtype=tl.float32)
            for i in tl.static_range(PER_WORD):
                x_i, sub = _value(words, high, x_rows, k_first, row_ok, K, i, BITS)
                x_sum += x_i
                qx += sub[None, :, :, :] * (x_i * _x_factor(i, BITS, 85))[:, None, :, :]
            zero = zero * 5.421010862427522e-20  # 2**-E: sum(x) is unscaled, the products carry 2**-E
            acc += scale[None, :, :, None] * (qx - zero[None, :, :, None] * x_sum[:, None, :, :])
        else:
            # several rows: the scale goes into the value once (q * s * 2**(shift - 49), normal and exact for
            # 2**-77 < s < 2**27), shared by the rows: then one FFMA a value and row (x * 2**(49 - shift))
            scale_up = scale * 1.2676506002282294e30  # 2**100
            for i in tl.static_range(PER_WORD):
                x_i, sub = _value(words, high, x_rows, k_first, row_ok, K, i, BITS)
                x_sum += x_i
                acc += (sub * scale_up[:, :, None])[None, :, :, :] * (x_i * _x_factor(i, BITS, 49))[:, None, :, :]
            acc -= (zero * scale)[None, :, :, None] * x_sum[:, None, :, :]
    result = tl.sum(tl.sum(acc, axis=3), axis=2)
    if BLOCK_M == 1:
        result = result * 18446744073709551616.0  # 2**E
    _store(result, b_ptr, out_ptr, part_ptr, lock_ptr, offs_m, offs_n, M, N, stride_om, pid_k, pid_n,
           HAS_BIAS, SPLIT_K, BLOCK_M, BLOCK_N)


@triton.jit
def _value(words, high, x_rows, k_first, row_ok, K, VALUE: tl.constexpr, BITS: tl.constexpr):
    """Value VALUE of every word: (x at its k [BM, G, WPB] fp32, the subnormal q * 2**(shift - 149) [BN, G, WPB])."""
    FROM_WORD: tl.constexpr = 20 // BITS + (BITS == 4)  # values below bit 20 are masked in place (int4: 5, int8: 2)
    SHIFT: tl.constexpr = BITS * VALUE if VALUE < FROM_WORD else BITS * VALUE - 16  # the bit offset in the word (or in word >> 16)
    kk = k_first + VALUE
    x_i = tl.load(x_rows + kk[None, :, :], mask=row_ok[:, None, None] & (kk < K)[None, :, :], other=0.0).to(tl.float32)
    if VALUE < FROM_WORD:
        sub = (words & (((1 << BITS) - 1) << SHIFT)).to(tl.float32, bitcast=True)
    else:
        sub = (high & (((1 << BITS) - 1) << SHIFT)).to(tl.float32, bitcast=True)
    return x_i, sub


@triton.jit
def _x_factor(VALUE: tl.constexpr, BITS: tl.constexpr, POWER: tl.constexpr):
    """2**(POWER - shift) for value VALUE (its shift as in _value), built from its exponent bits (exact)."""
    FROM_WORD: tl.constexpr = 20 // BITS + (BITS == 4)
    SHIFT: tl.constexpr = BITS * VALUE if VALUE < FROM_WORD else BITS * VALUE - 16
    return tl.full((), (POWER - SHIFT + 127) << 23, tl.int32).to(tl.float32, bitcast=True)


@triton.jit
def _store(result, b_ptr, out_ptr, part_ptr, lock_ptr, offs_m, offs_n, M, N, stride_om, pid_k, pid_n,
           HAS_BIAS: tl.constexpr, SPLIT_K: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """[BM, BN] fp32 -> out (+ bias); with split-K through the partials and the tile's counter."""
    mask = (offs_m[:, None] < M) & (offs_n[None, :] < N)
    out_ptrs = out_ptr + offs_m.to(tl.int64)[:, None] * stride_om + offs_n[None, :]
    if HAS_BIAS:
        bias = tl.load(b_ptr + offs_n, mask=offs_n < N, other=0.0).to(tl.float32)[None, :]
    if SPLIT_K == 1:
        if HAS_BIAS:
            result += bias
        tl.store(out_ptrs, result.to(out_ptr.dtype.element_ty), mask=mask)
    else:
        part_ptrs = part_ptr + offs_m.to(tl.int64)[:, None] * N + offs_n[None, :]  # partials [SPLIT_K, M, N] fp32
        tl.store(part_ptrs + pid_k * M * N, result, mask=mask)
        tl.debug_barrier()  # every thread's partial stored before the (release) count
        arrived = tl.atomic_add(lock_ptr + pid_n, 1, sem="acq_rel")
        if arrived == SPLIT_K - 1:
            total = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
            for split in tl.static_range(SPLIT_K):
                total += tl.load(part_ptrs + split * M * N, mask=mask, other=0.0, cache_modifier=".cg")
            if HAS_BIAS:
                total += bias
            tl.store(out_ptrs, total.to(out_ptr.dtype.element_ty), mask=mask)
            tl.atomic_xchg(lock_ptr + pid_n, 0)  # ready for the next launch (autotuning reuses the counters)


def _configs(entries: list[tuple[int, int, int, int, int]]) -> list[dict[str, int]]:
    return [{"BLOCK_N": bn, "K_WORDS": kw, "SPLIT_K": split, "STAGES": stages, "num_warps": warps, "num_stages": stages}
            for bn, kw, split, warps, stages in entries]


# (BLOCK_N, K_WORDS, SPLIT_K, num_warps, num_stages). K_WORDS int32 words of a row per K tile (int4:
# 8 values a word, int8: 4). Threads spread over a tile's 16-byte chunks of K first, then over its
# rows; each thread's rows share its x values (loaded, scaled, summed once a tile).
ONE_ROW_CONFIGS = _configs([
    (16, 256, 1, 4, 2), (32, 128, 1, 4, 2), (64, 64, 1, 4, 2), (64, 128, 1, 8, 2), (32, 256, 1, 8, 2), (16, 128, 1, 4, 3),
    (32, 64, 1, 4, 3), (128, 32, 1, 8, 3),
])
#: Several rows: fewer words a thread (the accumulators are per row and word slot).
DECODE_CONFIGS = _configs([
    (16, 32, 1, 4, 2), (32, 16, 1, 4, 3), (32, 32, 1, 8, 2), (64, 16, 1, 8, 3), (16, 64, 1, 8, 2), (16, 64, 1, 4, 3),
    (64, 32, 1, 8, 2),
])
#: Offered in addition where the columns alone leave SMs idle or unevenly loaded (splits_offered): e.g. N = 2560
#: at 16 columns a program is 160 programs on 132 SMs, two rounds for 28 of them; split 4 makes it 640.
SPLIT_CONFIGS = _configs([
    (32, 128, 2, 4, 2), (16, 256, 2, 4, 2), (32, 64, 4, 4, 2), (16, 128, 4, 4, 2), (32, 32, 8, 4, 2),
])
#: The same at several rows (small tiles).
DECODE_SPLIT_CONFIGS = _configs([(16, 32, 2, 4, 2), (16, 32, 4, 4, 2), (32, 16, 4, 4, 2), (32, 32, 2, 8, 2)])
_INTERPRETER = {"BLOCK_N": 8, "K_WORDS": 8, "SPLIT_K": 1, "STAGES": 1, "num_warps": 4, "num_stages": 1}
_INTERPRETER_SPLIT = {**_INTERPRETER, "SPLIT_K": 2}
_AUTOTUNE_KEY = ["M_KEY", "N", "K", "BITS", "QBLOCK", "HAS_ZEROS", "HAS_BIAS"]


def _bench(fn: Any, quantiles: Any = None) -> Any:
    """Triton's benchmark (L2 flushed before each call: decode streams weights from HBM), shorter."""
    import triton.testing

    return triton.testing.do_bench(fn, warmup=10, rep=40, quantiles=quantiles)


def configs_for(m: int, split: bool) -> list[dict[str, int]]:
    """The autotuner's configs at m rows; the split-K ones too where `split`."""
    if m == 1:
        return ONE_ROW_CONFIGS + (SPLIT_CONFIGS if split else [])
    return DECODE_CONFIGS + (DECODE_SPLIT_CONFIGS if split else [])


def _tuned(m_one: bool, split: bool) -> Any:
    interpreter = _INTERPRETER_SPLIT if split else _INTERPRETER
    return triton.autotune(configs=autotune_configs(configs_for(1 if m_one else 2, split), interpreter), key=_AUTOTUNE_KEY,
                           do_bench=_bench)(_wq_gemv_kernel)


_TUNED = {(one, split): _tuned(one, split) for one in (True, False) for split in (False, True)}


def splits_offered(n: int, device: torch.device) -> bool:
    """Whether the split-K configs compete: fewer than two 16-column tiles per SM (a split costs
    a zeroed counter buffer per call)."""
    return -(-n // 16) < 2 * multiprocessors(device)


#: The autotuner's pick per (M, N, K, bits, block, zero points?, bias?, x dtype, device), once it ran on real tensors.
CHOSEN: dict[tuple[Any, ...], dict[str, int]] = {}


def wq_gemv_triton(x: Tensor, packed: Tensor, scales: Tensor, zeros: Tensor | None, bias: Tensor | None,
                   bits: int, block_size: int, k: int, config: dict[str, int] | None = None) -> Tensor:
    """The decode kernel on x [..., K] with at most GEMV_MAX_M rows (CUDA tensors, or CPU ones under
    TRITON_INTERPRET=1); `config` forces a launch config (BLOCK_N, K_WORDS, SPLIT_K, num_warps,
    num_stages: tests and the kernel benchmark), None autotunes per shape. Checks are the caller's
    (wq_matmul.check_wq_linear).

    The autotuner's pick for a shape is remembered (`CHOSEN`) once it has run on real tensors (the
    compile-time timing of fx_weight_quant calls the op eagerly); later calls, and the trace inductor
    makes of this op, launch that config directly: no autotuner in the compiled graph, and no zeroed
    counter buffer (a memset launch per call) unless the pick splits K."""
    from torch._subclasses.fake_tensor import is_fake
    from torch.library import wrap_triton

    n, k_blocks = packed.shape[0], packed.shape[1]
    x2d = x.reshape(-1, k)
    m = x2d.shape[0]
    if not 1 <= m <= GEMV_MAX_M:
        raise ValueError(f"graphopt::wq_linear: the decode kernel takes 1 to {GEMV_MAX_M} rows, not {m}")
    if x2d.stride(1) != 1:
        x2d = x2d.contiguous()
    if packed.stride(2) != 1 or packed.stride(1) != packed.shape[2] or packed.stride(0) % 4 or packed.storage_offset() % 4:
        packed = packed.contiguous()  # each row is read as int32 words
    scales = scales.to(x.dtype)
    out = torch.empty((m, n), dtype=x.dtype, device=x.device)
    if n == 0:
        return out.reshape(*x.shape[:-1], n)
    key = (m, n, k, bits, block_size, zeros is not None, bias is not None, x.dtype, str(x.device))
    if config is None:
        config = CHOSEN.get(key)
    split = splits_offered(n, x.device) if config is None else config["SPLIT_K"] > 1
    if split:
        offered = [c.kwargs for c in _TUNED[(m == 1, True)].configs] if config is None else [config]
        max_split = max(c["SPLIT_K"] for c in offered)
        finest = min(c["BLOCK_N"] for c in offered)
        partials = torch.empty((max_split, m, n), dtype=torch.float32, device=x.device)
        locks = torch.zeros((-(-n // finest),), dtype=torch.int32, device=x.device)  # a counter per column tile of any config
    else:
        partials, locks = scales, scales  # never touched at SPLIT_K 1: a read-only stand-in
    args = (x2d, packed, scales, zeros if zeros is not None else packed, bias if bias is not None else scales, out, partials, locks,
            m, n, k, k_blocks, m, x2d.stride(0), packed.stride(0) // 4, scales.stride(0), out.stride(0))
    meta = dict(BITS=bits, QBLOCK=block_size, HAS_ZEROS=zeros is not None, HAS_BIAS=bias is not None, BLOCK_M=next_power_of_2(m))

    def grid(launch: dict[str, Any]) -> tuple[int, int]:
        return (triton.cdiv(n, launch["BLOCK_N"]), launch["SPLIT_K"])

    if config is not None:
        launch = dict(config)
        launch.setdefault("STAGES", launch.get("num_stages", 1))
        wrap_triton(_wq_gemv_kernel)[grid(launch)](*args, **meta, **launch)
    else:
        tuner = _TUNED[(m == 1, split)]
        wrap_triton(tuner)[grid](*args, **meta)
        best = getattr(tuner, "best_config", None)
        if best is not None and not is_fake(x):  # ran (and tuned) on real tensors
            CHOSEN[key] = {**best.kwargs, "num_warps": best.num_warps, "num_stages": best.num_stages}
    return out.reshape(*x.shape[:-1], n)

