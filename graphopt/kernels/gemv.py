"""graphopt::gemv_linear: ``y = x @ W^T + bias`` for decode, x [M, K] with few rows (M = 1..16),
W [N, K] as torch.nn.Linear stores it (contiguous along K), fp16 or bf16, fp32 accumulation.

At decode the product reads 2NK bytes of weight for 2MNK flops: it is bound by how fast W
streams from HBM, and cuBLAS's GEMM tiles leave much of that bandwidth unused at small N
(benchmarks/RESULTS.md, "Where a decode step's time goes": a 2048 x 2048 GEMV in ~10 us where
8 MB at 3 TB/s take 2.7 us). This kernel is built to stream W:

* many programs: one per BLOCK_N (1-16) rows of W and, where N is narrow, per split of K, so
  every SM has several programs' loads in flight;
* W read along K in BLOCK_K (256-1024) wide tiles, 16-byte vector loads, marked evict-first
  (it is read once); x (a few KB, read by every program) evict-last;
* two ways to multiply, both in the autotuner:
  - "sum" (USE_DOT 0): fp32 products summed with tl.sum. Each program keeps a
    [BLOCK_M, BLOCK_N, BLOCK_K] fp32 accumulator (one FMA per element per tile, no
    cross-thread traffic in the loop) and reduces it once after the loop; where that tile
    would not fit in registers it sums each K tile as it goes (LATE_SUM 0). BLOCK_M is the
    next power of two of M: no padding to 16 rows.
  - "dot" (USE_DOT 1): tl.dot on tensor cores with the rows padded to 16. For M of 8-16 the
    CUDA cores' fp32 FMAs (16 flops per weight byte at M = 16) can cost more than the
    bandwidth allows, tensor cores do not.
* split-K where N gives too few programs (`split_for`, chosen per shape outside the
  autotuner): each split writes its fp32 partial sums to a [SPLIT_K, M, N] buffer and a second
  small kernel adds them in split order, adds the bias and casts: deterministic (the same
  bits every run), at the cost of one more launch (~1-2 us in a CUDA graph). fp32
  tl.atomic_add into a zeroed buffer would also need a launch (the memset) plus a cast and
  would add in arrival order: not chosen.

The autotuners (one per M regime: M = 1, M = 2..16, M > 16) are keyed on (M bucket, N, K,
SPLIT_K, bias; Triton adds the dtypes) and time with triton.testing.do_bench, whose L2 flush
makes each timed call read W from HBM as in a decode step.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor

from graphopt.kernels._triton import autotune_configs, m_bucket, multiprocessors, next_power_of_2, tl, triton

__all__ = ["gemv_linear_reference", "gemv_linear_fake", "gemv_linear_triton", "check_gemv_linear", "split_for", "regime",
           "m_bucket", "CONFIGS", "SMALL_M", "DTYPES"]

#: The rows this kernel is made for (decode at batch 1-16); more rows still run, as several row tiles.
SMALL_M = 16
DTYPES = (torch.float16, torch.bfloat16)
#: The dot path's row tile (tl.dot's smallest M).
_DOT_M = 16


def check_gemv_linear(x: Tensor, weight: Tensor, bias: Tensor | None) -> None:
    """Shape and dtype rules every implementation shares."""
    torch._check(weight.dim() == 2, lambda: f"graphopt::gemv_linear: weight must be [N, K]; got {tuple(weight.shape)}")
    torch._check(x.dim() >= 1 and x.shape[-1] == weight.shape[1],
                 lambda: f"graphopt::gemv_linear: x {tuple(x.shape)} must end in K = {weight.shape[1]}")
    torch._check(x.dtype == weight.dtype, lambda: f"graphopt::gemv_linear: x is {x.dtype}, weight {weight.dtype}")
    if bias is not None:
        torch._check(tuple(bias.shape) == (weight.shape[0],),
                     lambda: f"graphopt::gemv_linear: bias {tuple(bias.shape)} must be [{weight.shape[0]}]")


def gemv_linear_fake(x: Tensor, weight: Tensor, bias: Tensor | None = None) -> Tensor:
    check_gemv_linear(x, weight, bias)
    return x.new_empty((*x.shape[:-1], weight.shape[0]))


def gemv_linear_reference(x: Tensor, weight: Tensor, bias: Tensor | None = None) -> Tensor:
    """The CPU implementation (and the op's meaning): torch's linear."""
    check_gemv_linear(x, weight, bias)
    return F.linear(x, weight, bias)


# --- Triton -------------------------------------------------------------------------------


@triton.jit
def _gemv_kernel(
    x_ptr, w_ptr, b_ptr, out_ptr, part_ptr,
    M, N, K, M_BUCKET,
    stride_xm, stride_wn, stride_om,
    HAS_BIAS: tl.constexpr, SPLIT_K: tl.constexpr, BLOCK_M: tl.constexpr,
    USE_DOT: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, STAGES: tl.constexpr,
):
    # M_BUCKET: only the autotuners' key. x and W are contiguous along K (the launcher sees to it).
    # BLOCK_M: the sum path's rows (next power of two of M, at most 16); the dot path uses 16.
    # STAGES: the K loop's software pipelining depth (num_stages alone pipelines only loops with a dot).
    pid_n = tl.program_id(0)
    pid_k = tl.program_id(1)
    pid_m = tl.program_id(2)
    ROWS: tl.constexpr = 16 if USE_DOT else BLOCK_M
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_m = pid_m * ROWS + tl.arange(0, ROWS)
    # wrap (not mask) out-of-range rows of W and x for the loads: the stores drop them
    w_rows = (offs_n % N).to(tl.int64)
    x_rows = (offs_m % M).to(tl.int64)
    kk = tl.arange(0, BLOCK_K)
    w_ptrs = w_ptr + w_rows[:, None] * stride_wn + kk[None, :]  # [BLOCK_N, BLOCK_K]
    x_ptrs = x_ptr + x_rows[:, None] * stride_xm + kk[None, :]  # [ROWS, BLOCK_K]
    k_tiles = tl.cdiv(K, BLOCK_K)
    full_tiles = K // BLOCK_K  # tiles without a ragged end: no mask
    per_split = tl.cdiv(k_tiles, SPLIT_K)
    first = pid_k * per_split
    last = tl.minimum(first + per_split, k_tiles)
    LATE_SUM: tl.constexpr = ROWS * BLOCK_N * BLOCK_K <= 8192  # the 3-D accumulator fits in registers

    if USE_DOT:
        acc = tl.zeros((ROWS, BLOCK_N), dtype=tl.float32)
        for t in tl.range(first, tl.minimum(last, full_tiles), num_stages=STAGES):
            w = tl.load(w_ptrs + t * BLOCK_K, eviction_policy="evict_first")
            xt = tl.load(x_ptrs + t * BLOCK_K, eviction_policy="evict_last")
            acc = tl.dot(xt, tl.trans(w), acc)
        if (full_tiles < last) & (full_tiles >= first):  # the ragged last tile, in the split that owns it
            k_mask = (full_tiles * BLOCK_K + kk) < K
            w = tl.load(w_ptrs + full_tiles * BLOCK_K, mask=k_mask[None, :], other=0.0)
            xt = tl.load(x_ptrs + full_tiles * BLOCK_K, mask=k_mask[None, :], other=0.0)
            acc = tl.dot(xt, tl.trans(w), acc)
        result = acc
    elif LATE_SUM:
        acc3 = tl.zeros((ROWS, BLOCK_N, BLOCK_K), dtype=tl.float32)
        for t in tl.range(first, tl.minimum(last, full_tiles), num_stages=STAGES):
            w = tl.load(w_ptrs + t * BLOCK_K, eviction_policy="evict_first").to(tl.float32)
            xt = tl.load(x_ptrs + t * BLOCK_K, eviction_policy="evict_last").to(tl.float32)
            acc3 += xt[:, None, :] * w[None, :, :]
        if (full_tiles < last) & (full_tiles >= first):
            k_mask = (full_tiles * BLOCK_K + kk) < K
            w = tl.load(w_ptrs + full_tiles * BLOCK_K, mask=k_mask[None, :], other=0.0).to(tl.float32)
            xt = tl.load(x_ptrs + full_tiles * BLOCK_K, mask=k_mask[None, :], other=0.0).to(tl.float32)
            acc3 += xt[:, None, :] * w[None, :, :]
        result = tl.sum(acc3, axis=2)
    else:
        acc = tl.zeros((ROWS, BLOCK_N), dtype=tl.float32)
        for t in tl.range(first, tl.minimum(last, full_tiles), num_stages=STAGES):
            w = tl.load(w_ptrs + t * BLOCK_K, eviction_policy="evict_first").to(tl.float32)
            xt = tl.load(x_ptrs + t * BLOCK_K, eviction_policy="evict_last").to(tl.float32)
            acc += tl.sum(xt[:, None, :] * w[None, :, :], axis=2)
        if (full_tiles < last) & (full_tiles >= first):
            k_mask = (full_tiles * BLOCK_K + kk) < K
            w = tl.load(w_ptrs + full_tiles * BLOCK_K, mask=k_mask[None, :], other=0.0).to(tl.float32)
            xt = tl.load(x_ptrs + full_tiles * BLOCK_K, mask=k_mask[None, :], other=0.0).to(tl.float32)
            acc += tl.sum(xt[:, None, :] * w[None, :, :], axis=2)
        result = acc

    mask = (offs_m[:, None] < M) & (offs_n[None, :] < N)
    if SPLIT_K == 1:
        if HAS_BIAS:
            result += tl.load(b_ptr + offs_n, mask=offs_n < N, other=0.0).to(tl.float32)[None, :]
        out_ptrs = out_ptr + offs_m.to(tl.int64)[:, None] * stride_om + offs_n[None, :]
        tl.store(out_ptrs, result.to(out_ptr.dtype.element_ty), mask=mask)
    else:
        # partials [SPLIT_K, M, N] fp32, summed in split order by _gemv_reduce_kernel
        part_ptrs = part_ptr + (pid_k * M + offs_m.to(tl.int64))[:, None] * N + offs_n[None, :]
        tl.store(part_ptrs, result, mask=mask)


@triton.jit
def _gemv_reduce_kernel(part_ptr, b_ptr, out_ptr, M, N, stride_om, HAS_BIAS: tl.constexpr, SPLIT_K: tl.constexpr,
                        BLOCK: tl.constexpr):
    """out[m, n] = sum over splits s in order of partials[s, m, n] (+ bias[n]), cast to out's dtype."""
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < M * N
    total = tl.zeros((BLOCK,), dtype=tl.float32)
    for s in tl.static_range(SPLIT_K):
        total += tl.load(part_ptr + s * M * N + offs, mask=mask, other=0.0, eviction_policy="evict_first")
    n = offs % N
    if HAS_BIAS:
        total += tl.load(b_ptr + n, mask=mask, other=0.0).to(tl.float32)
    tl.store(out_ptr + (offs // N).to(tl.int64) * stride_om + n, total.to(out_ptr.dtype.element_ty), mask=mask)


def _configs(entries: list[tuple[int, int, int, int, int]]) -> list[dict[str, int]]:
    return [{"USE_DOT": dot, "BLOCK_N": bn, "BLOCK_K": bk, "STAGES": stages, "num_warps": warps, "num_stages": stages}
            for dot, bn, bk, warps, stages in entries]


# (USE_DOT, BLOCK_N, BLOCK_K, num_warps, num_stages) per M regime; the benchmark (benchmarks/gemv_bench.py)
# times each of them against cuBLAS at TinyLlama's decode shapes.
CONFIGS = {
    # M = 1: the sum path, few rows per program and wide K tiles; one dot config for comparison
    "m1": _configs([
        (0, 1, 1024, 4, 3), (0, 2, 512, 4, 3), (0, 2, 1024, 4, 3), (0, 4, 256, 2, 4), (0, 4, 512, 4, 3),
        (0, 4, 1024, 8, 2), (0, 8, 256, 4, 3), (0, 8, 512, 8, 2), (0, 16, 256, 8, 2), (1, 16, 256, 4, 3),
    ]),
    # M = 2..16: the sum path (its BLOCK_M the next power of two of M) against tensor-core dot tiles
    # (at N = 2048 a dot tile of 16 rows leaves one program per SM: deep pipelines keep its loads in flight)
    "small": _configs([
        (0, 1, 512, 4, 3), (0, 2, 256, 4, 3), (0, 2, 512, 4, 3), (0, 4, 256, 4, 3), (0, 8, 256, 8, 2),
        (1, 16, 256, 4, 3), (1, 16, 256, 4, 5), (1, 16, 512, 4, 4), (1, 16, 512, 8, 3), (1, 32, 256, 4, 4),
        (1, 32, 512, 8, 3), (1, 64, 256, 8, 3),
    ]),
    # M > 16: still correct, tuned only for the dot tiles (the graph path sends such rows to inductor's GEMM)
    "many": _configs([(1, 32, 128, 4, 3), (1, 64, 128, 4, 3), (1, 64, 64, 4, 4), (1, 128, 64, 8, 3)]),
}
#: Under the interpreter: one small config per regime (tests pass others explicitly).
_INTERPRETER = {"m1": {"USE_DOT": 0, "BLOCK_N": 4, "BLOCK_K": 32, "STAGES": 1},
                "small": {"USE_DOT": 0, "BLOCK_N": 2, "BLOCK_K": 32, "STAGES": 1},
                "many": {"USE_DOT": 1, "BLOCK_N": 16, "BLOCK_K": 32, "STAGES": 1}}
_AUTOTUNE_KEY = ["M_BUCKET", "N", "K", "SPLIT_K", "HAS_BIAS", "BLOCK_M"]
_REDUCE_BLOCK = 1024


def _bench(fn: Any, quantiles: Any = None) -> Any:
    """Triton's benchmark (L2 flushed before each call: decode streams weights from HBM), shorter."""
    import triton.testing

    return triton.testing.do_bench(fn, warmup=10, rep=40, quantiles=quantiles)


def _tuned(configs: list[dict[str, int]], interpreter: dict[str, int]) -> Any:
    return triton.autotune(configs=autotune_configs(configs, {**interpreter, "num_warps": 4, "num_stages": 1}),
                           key=_AUTOTUNE_KEY, do_bench=_bench)(_gemv_kernel)


_TUNED = {name: _tuned(configs, _INTERPRETER[name]) for name, configs in CONFIGS.items()}


def regime(m: int) -> str:
    return "m1" if m == 1 else "small" if m <= SMALL_M else "many"


def split_for(m: int, n: int, k: int, device: torch.device) -> int:
    """Split-K where N is narrow: fewer than two programs per SM at 4 rows a program (the
    sum path's typical tile) get up to 8 splits of at least 512 of K each; 1 otherwise
    (TinyLlama's decode shapes, N >= 2048, are never split)."""
    if m > SMALL_M:
        return 1
    programs = -(-n // 4)
    sms = multiprocessors(device)
    if programs >= 2 * sms:
        return 1
    return max(1, min(8, -(-2 * sms // programs), k // 512))


def _rows_tile(m: int) -> int:
    """The sum path's BLOCK_M: the next power of two of M, at most 16."""
    return min(next_power_of_2(m), SMALL_M)


def gemv_linear_triton(x: Tensor, weight: Tensor, bias: Tensor | None = None, split_k: int | None = None,
                       config: dict[str, int] | None = None) -> Tensor:
    """Launch the Triton kernel (CUDA tensors, or CPU tensors under TRITON_INTERPRET=1).
    `split_k` forces a split and `config` a launch config (USE_DOT, BLOCK_N, BLOCK_K, num_warps,
    num_stages: tests and the benchmark); None picks them (the split from the shape, the tiles
    by autotuning keyed on the shape)."""
    from torch.library import wrap_triton

    check_gemv_linear(x, weight, bias)
    n, k = weight.shape
    m = x.numel() // k if k else int(torch.Size(x.shape[:-1]).numel())
    x2d = x.reshape(m, k)
    if x2d.stride(-1) != 1:
        x2d = x2d.contiguous()
    if weight.stride(-1) != 1:
        weight = weight.contiguous()  # the kernel reads W along K; nn.Linear's weight already is
    out = torch.empty((m, n), dtype=x.dtype, device=x.device)
    if m == 0 or n == 0:
        return out.reshape(*x.shape[:-1], n)
    if k == 0:
        out.zero_()
        if bias is not None:
            out += bias
        return out.reshape(*x.shape[:-1], n)
    split = split_for(m, n, k, x.device) if split_k is None else max(1, int(split_k))
    # unsplit, the partials are never touched: x stands in (not out, no aliased outputs for inductor; not W, a constant)
    partials = torch.empty((split, m, n), dtype=torch.float32, device=x.device) if split > 1 else x2d
    args = (x2d, weight, bias if bias is not None else weight, out, partials, m, n, k, m_bucket(m),
            x2d.stride(0), weight.stride(0), out.stride(0))
    meta = dict(HAS_BIAS=bias is not None, SPLIT_K=split, BLOCK_M=_rows_tile(m))

    def grid(launch: dict[str, Any]) -> tuple[int, int, int]:
        rows = _DOT_M if launch["USE_DOT"] else meta["BLOCK_M"]
        return (triton.cdiv(n, launch["BLOCK_N"]), split, triton.cdiv(m, rows))

    if config is not None:
        launch = dict(config)
        launch.setdefault("STAGES", launch.get("num_stages", 1))
        wrap_triton(_gemv_kernel)[grid(launch)](*args, **meta, **launch)
    else:
        wrap_triton(_TUNED[regime(m)])[grid](*args, **meta)
    if split > 1:
        wrap_triton(_gemv_reduce_kernel)[(triton.cdiv(m * n, _REDUCE_BLOCK),)](
            partials, bias if bias is not None else weight, out, m, n, out.stride(0),
            HAS_BIAS=bias is not None, SPLIT_K=split, BLOCK=_REDUCE_BLOCK)
    return out.reshape(*x.shape[:-1], n)
