"""graphopt::attention: scaled dot-product attention, flash-style (one pass, online softmax).

Semantics are ``torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask,
is_causal=is_causal, scale=scale, enable_gqa=True)``:

* q ``[B, Hq, S, D]``, k ``[B, Hkv, T, D]``, v ``[B, Hkv, T, Dv]``, ``Hq % Hkv == 0``; query head
  ``h`` reads key/value head ``h // (Hq // Hkv)`` (MHA, GQA, MQA).
* ``attn_mask`` broadcasts to ``[B, Hq, S, T]``: bool (True = attend) or floating (added to
  the scaled scores). ``is_causal`` is SDPA's top-left causal mask (query ``i`` sees keys
  ``j <= i``); given together with ``attn_mask`` both apply.
* ``scale`` defaults to ``1 / sqrt(D)``. A query row that may attend to nothing gives zeros
  (as SDPA does on CPU), not NaN.
* The output ``[B, Hq, S, Dv]`` is stored as ``[B, S, Hq, Dv]`` (as torch's flash and
  memory-efficient SDPA store theirs): the usual ``out.transpose(1, 2).reshape(B, S, Hq * Dv)``
  that follows attention is then a view, not a copy. Every implementation (fake included)
  returns that layout.

The Triton kernel keeps one block of queries in registers and walks the keys in tiles,
carrying the running row maximum, the running sum of exponentials and the unnormalised
output (the FlashAttention-2 forward). Scores are kept in base-2 units (``exp2``) with
``scale * log2(e)`` folded into one multiply. Key tiles that need no masking (inside the
sequence and, when causal, wholly below the diagonal) take a branch-free path; only the
last tiles pay for bounds and causal masks.
"""

import math

import torch
import torch.nn.functional as F
from torch import Tensor

from graphopt.kernels._triton import autotune_configs, dot_precision, next_power_of_2, tl, triton

__all__ = ["check_attention", "attention_reference", "attention_triton", "attention_fake"]

_LOG2E = math.log2(math.e)
_NO_MASK, _BOOL_MASK, _ADDITIVE_MASK = 0, 1, 2


def check_attention(q: Tensor, k: Tensor, v: Tensor, attn_mask: Tensor | None) -> None:
    """Shape and dtype rules shared by every implementation (works on symbolic shapes)."""
    shapes = f"q {tuple(q.shape)}, k {tuple(k.shape)}, v {tuple(v.shape)}"
    torch._check(q.dim() == 4 and k.dim() == 4 and v.dim() == 4, lambda: f"graphopt::attention: q, k and v must be 4-D [B, H, S, D]; got {shapes}")
    torch._check(q.dtype == k.dtype == v.dtype, lambda: f"graphopt::attention: q, k and v must share a dtype; got {q.dtype}, {k.dtype}, {v.dtype}")
    torch._check(q.dtype.is_floating_point, lambda: f"graphopt::attention: expected floating tensors, got {q.dtype}")
    torch._check(q.shape[0] == k.shape[0] == v.shape[0], lambda: f"graphopt::attention: batch sizes differ: {shapes}")
    torch._check(k.shape[1] == v.shape[1] and k.shape[2] == v.shape[2], lambda: f"graphopt::attention: k and v must agree on heads and length: {shapes}")
    torch._check(q.shape[3] == k.shape[3], lambda: f"graphopt::attention: q and k head sizes differ: {shapes}")
    torch._check(k.shape[1] > 0 and q.shape[1] % k.shape[1] == 0, lambda: f"graphopt::attention: query heads must be a multiple of key/value heads: {shapes}")
    if attn_mask is None:
        return
    torch._check(
        attn_mask.dtype == torch.bool or attn_mask.dtype.is_floating_point,
        lambda: f"graphopt::attention: attn_mask must be bool or floating, got {attn_mask.dtype}",
    )
    full = (q.shape[0], q.shape[1], q.shape[2], k.shape[2])
    torch._check(attn_mask.dim() <= 4, lambda: f"graphopt::attention: attn_mask {tuple(attn_mask.shape)} has more than 4 dims")
    for got, want in zip(reversed(attn_mask.shape), reversed(full)):
        torch._check(got == 1 or got == want, lambda: f"graphopt::attention: attn_mask {tuple(attn_mask.shape)} does not broadcast to {full}")


def _new_output(q: Tensor, v: Tensor) -> Tensor:
    """An empty [B, Hq, S, Dv] output stored as [B, S, Hq, Dv] (see the module docstring)."""
    return q.new_empty((q.shape[0], q.shape[2], q.shape[1], v.shape[3])).transpose(1, 2)


def attention_fake(q: Tensor, k: Tensor, v: Tensor, attn_mask: Tensor | None = None, is_causal: bool = False, scale: float | None = None) -> Tensor:
    check_attention(q, k, v, attn_mask)
    return _new_output(q, v)


def attention_reference(
    q: Tensor, k: Tensor, v: Tensor, attn_mask: Tensor | None = None, is_causal: bool = False, scale: float | None = None
) -> Tensor:
    """The CPU implementation: torch's own SDPA, with causal + mask merged into one mask
    (SDPA refuses both on some backends) and floating masks in the query dtype (SDPA's rule)."""
    check_attention(q, k, v, attn_mask)
    mask = attn_mask
    if is_causal and mask is not None:
        causal = torch.ones(q.shape[2], k.shape[2], dtype=torch.bool, device=q.device).tril()
        mask = mask & causal if mask.dtype == torch.bool else mask.masked_fill(~causal, float("-inf"))
    if mask is not None and mask.dtype != torch.bool and mask.dtype != q.dtype:
        mask = mask.to(q.dtype)
    out = F.scaled_dot_product_attention(
        q, k, v, attn_mask=mask, is_causal=is_causal and attn_mask is None, scale=scale, enable_gqa=bool(q.shape[1] != k.shape[1])
    )
    return _new_output(q, v).copy_(out)


# --- Triton -------------------------------------------------------------------------------

# Rows of up to 256 bytes (fp16/bf16 head dims <= 128, fp32 <= 64): the usual tiles.
# The configs that won at BERT's, ViT's and GPT-2's shapes on an H200 (fp16, head dim 64;
# benchmarks/attention_autotune.py). Each config is compiled on first use: the three others
# tried there never won and cost about 2.5 s of compile time on a cold machine.
_GPU_CONFIGS = [
    {"BLOCK_M": 128, "BLOCK_N": 64, "num_warps": 8, "num_stages": 3},  # BERT b8 s128
    {"BLOCK_M": 64, "BLOCK_N": 64, "num_warps": 4, "num_stages": 3},  # ViT b8 s197
    {"BLOCK_M": 64, "BLOCK_N": 128, "num_warps": 4, "num_stages": 2},  # GPT-2 b1 s512, causal
]
# Wider rows (fp32 with head dims > 64, 16-bit ones > 128): smaller tiles, so that the
# pipelined key/value tiles still fit in shared memory.
_GPU_CONFIGS_WIDE_ROWS = [
    {"BLOCK_M": 64, "BLOCK_N": 64, "num_warps": 4, "num_stages": 2},
    {"BLOCK_M": 64, "BLOCK_N": 32, "num_warps": 4, "num_stages": 3},
    {"BLOCK_M": 64, "BLOCK_N": 32, "num_warps": 4, "num_stages": 2},
    {"BLOCK_M": 32, "BLOCK_N": 32, "num_warps": 4, "num_stages": 2},
]
_WIDE_ROW_BYTES = 256
_INTERPRETER_CONFIG = {"BLOCK_M": 16, "BLOCK_N": 16, "num_warps": 4, "num_stages": 1}
_AUTOTUNE_KEY = ["S", "T", "HEAD_D", "HEAD_DV", "IS_CAUSAL", "MASK_KIND"]


@triton.jit
def _attention_tiles(
    acc, l_i, m_i, q, k_base, v_base, mask_base, offs_m, row_ok, lo, hi,
    stride_kt, stride_kd, stride_vt, stride_vd, stride_mask_s, stride_mask_t, T, qk_scale,
    MASKED: tl.constexpr, IS_CAUSAL: tl.constexpr, MASK_KIND: tl.constexpr, ALLOW_TF32: tl.constexpr,
    HEAD_D: tl.constexpr, HEAD_DV: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_DV: tl.constexpr, BLOCK_N: tl.constexpr,
):
    """Fold the key tiles [lo, hi) into (acc, l_i, m_i).

    MASKED tiles may reach past T or cross the causal diagonal; the others need neither mask."""
    offs_d = tl.arange(0, BLOCK_D)
    offs_dv = tl.arange(0, BLOCK_DV)
    d_ok = offs_d < HEAD_D  # all true, and folded away, when HEAD_D is a power of 2
    dv_ok = offs_dv < HEAD_DV
    for start_n in range(lo, hi, BLOCK_N):
        offs_n = start_n + tl.arange(0, BLOCK_N)
        col_ok = offs_n < T
        k_ptrs = k_base + offs_n[None, :] * stride_kt + offs_d[:, None] * stride_kd
        if MASKED:
            k_tile = tl.load(k_ptrs, mask=col_ok[None, :] & d_ok[:, None], other=0.0)
        else:
            k_tile = tl.load(k_ptrs, mask=d_ok[:, None], other=0.0)
        if ALLOW_TF32:
            scores = tl.dot(q, k_tile, input_precision="tf32")
        else:
            scores = tl.dot(q, k_tile, input_precision="ieee")
        scores = scores * qk_scale  # base-2 units from here on

        if MASK_KIND != 0:
            mask_ptrs = mask_base + offs_m[:, None] * stride_mask_s + offs_n[None, :] * stride_mask_t
            if MASKED:
                mask_ok = row_ok[:, None] & col_ok[None, :]
            else:
                mask_ok = row_ok[:, None]
        if MASK_KIND == 2:  # additive mask, converted to base-2 units like the scores
            bias = tl.load(mask_ptrs, mask=mask_ok, other=0.0).to(tl.float32)
            # finfo.min (HF's "masked") must stay finite in base 2, as it is in SDPA: a row
            # masked that way everywhere averages v; -inf stays -inf (attends to nothing)
            bias2 = tl.maximum(bias * 1.4426950408889634, -3.4028234663852886e38)
            scores += tl.where(bias == float("-inf"), float("-inf"), bias2)
        if MASK_KIND == 1:  # bool mask: True = attend
            keep = tl.load(mask_ptrs, mask=mask_ok, other=0) != 0
            if MASKED:
                keep = keep & col_ok[None, :]
                if IS_CAUSAL:
                    keep = keep & (offs_n[None, :] <= offs_m[:, None])
            scores = tl.where(keep, scores, float("-inf"))
        elif MASKED:
            keep = col_ok[None, :]
            if IS_CAUSAL:
                keep = keep & (offs_n[None, :] <= offs_m[:, None])
            scores = tl.where(keep, scores, float("-inf"))

        m_new = tl.maximum(m_i, tl.max(scores, 1))
        if MASK_KIND != 0:
            # a row with nothing to attend to so far has m_new = -inf: use 0 as the base so
            # that exp2 gives 0 rather than NaN (without a user mask every row sees key 0)
            base = tl.where(m_new == float("-inf"), 0.0, m_new)
        else:
            base = m_new
        alpha = tl.math.exp2(m_i - base)
        p = tl.math.exp2(scores - base[:, None])
        l_i = l_i * alpha + tl.sum(p, 1)
        v_ptrs = v_base + offs_n[:, None] * stride_vt + offs_dv[None, :] * stride_vd
        if MASKED:
            v_tile = tl.load(v_ptrs, mask=col_ok[:, None] & dv_ok[None, :], other=0.0)
        else:
            v_tile = tl.load(v_ptrs, mask=dv_ok[None, :], other=0.0)
        acc = acc * alpha[:, None]
        if ALLOW_TF32:
            acc = tl.dot(p.to(v_tile.dtype), v_tile, acc, input_precision="tf32")
        else:
            acc = tl.dot(p.to(v_tile.dtype), v_tile, acc, input_precision="ieee")
        m_i = m_new
    return acc, l_i, m_i


@triton.jit
def _attention_fwd(
    q_ptr, k_ptr, v_ptr, mask_ptr, out_ptr,
    stride_qb, stride_qh, stride_qs, stride_qd,
    stride_kb, stride_kh, stride_kt, stride_kd,
    stride_vb, stride_vh, stride_vt, stride_vd,
    stride_mb, stride_mh, stride_ms, stride_mt,
    stride_ob, stride_oh, stride_os, stride_od,
    H, GROUP, S, T, qk_scale,
    IS_CAUSAL: tl.constexpr, MASK_KIND: tl.constexpr, ALLOW_TF32: tl.constexpr,
    HEAD_D: tl.constexpr, HEAD_DV: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_DV: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
):
    # inductor passes Python floats as fp64 (Triton's launcher as fp32): without this cast
    # the scores, and through them the accumulator, would be fp64 (tl.dot refuses that)
    qk_scale = tl.cast(qk_scale, tl.float32)
    # one program per (query block, batch * head); query blocks vary fastest so that the
    # programs running together share their key/value head in L2
    num_m_blocks = tl.cdiv(S, BLOCK_M)
    pid = tl.program_id(0)
    start_m = pid % num_m_blocks
    bh = pid // num_m_blocks
    b = (bh // H).to(tl.int64)
    h = (bh % H).to(tl.int64)
    h_kv = h // GROUP

    offs_m = start_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, BLOCK_D)
    offs_dv = tl.arange(0, BLOCK_DV)
    row_ok = offs_m < S
    q = tl.load(
        q_ptr + b * stride_qb + h * stride_qh + offs_m[:, None] * stride_qs + offs_d[None, :] * stride_qd,
        mask=row_ok[:, None] & (offs_d[None, :] < HEAD_D), other=0.0,
    )
    k_base = k_ptr + b * stride_kb + h_kv * stride_kh
    v_base = v_ptr + b * stride_vb + h_kv * stride_vh
    mask_base = mask_ptr + b * stride_mb + h * stride_mh

    m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_DV], dtype=tl.float32)

    if IS_CAUSAL:
        hi = tl.minimum(T, (start_m + 1) * BLOCK_M)
        unmasked_end = tl.minimum(start_m * BLOCK_M, T) // BLOCK_N * BLOCK_N
    else:
        hi = T
        unmasked_end = T // BLOCK_N * BLOCK_N
    acc, l_i, m_i = _attention_tiles(
        acc, l_i, m_i, q, k_base, v_base, mask_base, offs_m, row_ok, 0, unmasked_end,
        stride_kt, stride_kd, stride_vt, stride_vd, stride_ms, stride_mt, T, qk_scale,
        False, IS_CAUSAL, MASK_KIND, ALLOW_TF32, HEAD_D, HEAD_DV, BLOCK_D, BLOCK_DV, BLOCK_N,
    )
    acc, l_i, m_i = _attention_tiles(
        acc, l_i, m_i, q, k_base, v_base, mask_base, offs_m, row_ok, unmasked_end, hi,
        stride_kt, stride_kd, stride_vt, stride_vd, stride_ms, stride_mt, T, qk_scale,
        True, IS_CAUSAL, MASK_KIND, ALLOW_TF32, HEAD_D, HEAD_DV, BLOCK_D, BLOCK_DV, BLOCK_N,
    )
    l_i = tl.where(l_i == 0.0, 1.0, l_i)  # rows that attend to nothing: 0, not 0/0
    out = acc / l_i[:, None]
    tl.store(
        out_ptr + b * stride_ob + h * stride_oh + offs_m[:, None] * stride_os + offs_dv[None, :] * stride_od,
        out.to(out_ptr.dtype.element_ty),
        mask=row_ok[:, None] & (offs_dv[None, :] < HEAD_DV),
    )


# two autotuned launchers of the one kernel, told apart by the bytes in a head's row
_attention_fwd_tuned = triton.autotune(configs=autotune_configs(_GPU_CONFIGS, _INTERPRETER_CONFIG), key=_AUTOTUNE_KEY)(_attention_fwd)
_attention_fwd_wide_rows = triton.autotune(configs=autotune_configs(_GPU_CONFIGS_WIDE_ROWS, _INTERPRETER_CONFIG), key=_AUTOTUNE_KEY)(_attention_fwd)


def attention_triton(
    q: Tensor, k: Tensor, v: Tensor, attn_mask: Tensor | None = None, is_causal: bool = False, scale: float | None = None
) -> Tensor:
    """Launch the Triton kernel (CUDA tensors, or CPU tensors under TRITON_INTERPRET=1)."""
    from torch.library import wrap_triton

    check_attention(q, k, v, attn_mask)
    batch, heads, seq_q, head_d = q.shape
    heads_kv, seq_k, head_dv = k.shape[1], k.shape[2], v.shape[3]
    out = _new_output(q, v)  # the kernel writes through out's strides
    if out.numel() == 0:
        return out
    if scale is None:
        scale = 1.0 / math.sqrt(head_d)
    mask_strides: tuple[int, ...] = (0, 0, 0, 0)
    if attn_mask is None:
        mask_kind, mask = _NO_MASK, q  # never read: MASK_KIND is a compile-time constant
    else:
        mask_kind = _BOOL_MASK if attn_mask.dtype == torch.bool else _ADDITIVE_MASK
        mask = attn_mask.expand(batch, heads, seq_q, seq_k)  # a view: broadcast dims get stride 0
        mask_strides = mask.stride()

    def grid(meta: dict) -> tuple[int]:
        return (triton.cdiv(seq_q, meta["BLOCK_M"]) * batch * heads,)

    row_bytes = max(head_d, head_dv) * q.element_size()
    kernel = _attention_fwd_wide_rows if row_bytes > _WIDE_ROW_BYTES else _attention_fwd_tuned
    wrap_triton(kernel)[grid](
        q, k, v, mask, out,
        *q.stride(), *k.stride(), *v.stride(), *mask_strides, *out.stride(),
        heads, heads // heads_kv, seq_q, seq_k, scale * _LOG2E,
        IS_CAUSAL=is_causal, MASK_KIND=mask_kind, ALLOW_TF32=dot_precision(q.dtype) == "tf32",
        HEAD_D=head_d, HEAD_DV=head_dv, BLOCK_D=max(16, next_power_of_2(head_d)), BLOCK_DV=max(16, next_power_of_2(head_dv)),
    )
    return out
