"""graphopt::decode_attention: one query position attending to a KV cache, split-K (flash-decoding).

Semantics are graphopt::attention's (SDPA with enable_gqa) for a query of length 1 and no
causal flag: q ``[B, Hq, 1, D]``, k ``[B, Hkv, T, D]``, v ``[B, Hkv, T, Dv]`` (a static cache:
T is its capacity, the mask says which positions hold tokens), ``Hq % Hkv == 0``, a mask
broadcasting to ``[B, Hq, 1, T]`` (bool: True attends; floating: added to the scaled
scores). A row that may attend to nothing gives zeros. The output has graphopt::attention's
layout (``[B, Hq, 1, Dv]`` stored as ``[B, 1, Hq, Dv]``).

Why another kernel: at decode the flash kernel of graphopt.kernels.attention runs one
program per (batch, query head) walking the whole cache, B * Hq programs for 132 SMs, and
reads each key/value head once per query head of its group. Here one program takes one
(batch, key/value head, split of the cache) and all the group's query heads at once (one
read of each key/value row), and the cache is cut into splits so that the whole GPU streams
it (stage 1: per split the running max, sum and unnormalised output; stage 2: their
log-sum-exp merge per query head).

The key range (``key_positions``, ``query_position``, ``window``): where the caller has proven
from the mask that it hides every cache row whose position is after the query's (causal) and,
with ``window`` > 0, every row at or before query - window (a sliding window), it hands over the
positions (``key_positions``, T of them in any shape: row r holds position key_positions' first + r; ``query_position``:
one element) and the kernel reads only the rows in between: window rows instead of the cache's
capacity, and up to the query's position instead of past it. Both are read on the device (no
host sync; a CUDA graph replays with the next step's positions). The splits then cover
min(T, window) rows from the first visible one. The reference applies the same range as a mask.
"""

import math

import torch
from torch import Tensor

from graphopt.kernels._triton import INTERPRET, next_power_of_2, tl, triton
from graphopt.kernels.attention import _new_output, attention_reference, check_attention

__all__ = ["decode_attention_reference", "decode_attention_triton", "decode_attention_fake", "check_decode_attention", "key_range_mask",
           "num_splits"]

_LOG2E = math.log2(math.e)
_NO_MASK, _BOOL_MASK, _ADDITIVE_MASK = 0, 1, 2


def check_decode_attention(q: Tensor, k: Tensor, v: Tensor, attn_mask: Tensor | None,
                           key_positions: Tensor | None = None, query_position: Tensor | None = None) -> None:
    check_attention(q, k, v, attn_mask)
    torch._check(q.shape[2] == 1, lambda: f"graphopt::decode_attention: one query position, got q {tuple(q.shape)}")
    torch._check((key_positions is None) == (query_position is None),
                 lambda: "graphopt::decode_attention: key_positions and query_position come together")
    if key_positions is not None and query_position is not None:
        torch._check(key_positions.numel() == k.shape[2] and not key_positions.dtype.is_floating_point,
                     lambda: f"graphopt::decode_attention: key_positions must be {k.shape[2]} integers, got {tuple(key_positions.shape)}")
        torch._check(query_position.numel() == 1 and not query_position.dtype.is_floating_point,
                     lambda: f"graphopt::decode_attention: query_position must be one integer, got {tuple(query_position.shape)}")


def decode_attention_fake(q: Tensor, k: Tensor, v: Tensor, attn_mask: Tensor | None = None, scale: float | None = None,
                          key_positions: Tensor | None = None, query_position: Tensor | None = None, window: int = -1) -> Tensor:
    check_decode_attention(q, k, v, attn_mask, key_positions, query_position)
    return _new_output(q, v)


def key_range_mask(key_positions: Tensor, query_position: Tensor, window: int, seq_k: int) -> Tensor:
    """[T] bool: the rows the kernel reads (row r at key_positions[0] + r, up to the query's position, after
    query - window where window > 0)."""
    pos = key_positions.reshape(-1)[:1] + torch.arange(seq_k, device=key_positions.device)
    query = query_position.reshape(-1)[:1]
    keep = pos <= query
    return keep & (pos > query - window) if window > 0 else keep


def decode_attention_reference(q: Tensor, k: Tensor, v: Tensor, attn_mask: Tensor | None = None, scale: float | None = None,
                               key_positions: Tensor | None = None, query_position: Tensor | None = None, window: int = -1) -> Tensor:
    check_decode_attention(q, k, v, attn_mask, key_positions, query_position)
    if key_positions is not None and query_position is not None:
        keep = key_range_mask(key_positions, query_position, window, k.shape[2]).view(1, 1, 1, -1)
        if attn_mask is None:
            attn_mask = keep
        elif attn_mask.dtype == torch.bool:
            attn_mask = attn_mask & keep
        else:
            attn_mask = attn_mask.masked_fill(~keep, float("-inf"))
    return attention_reference(q, k, v, attn_mask, False, scale)


def num_splits(batch: int, heads_kv: int, seq_k: int, block_n: int, programs: int = 264) -> int:
    """Splits of the cache so that about `programs` programs run (two per SM of an H100), each
    at least one tile of keys."""
    return max(1, min(triton.cdiv(seq_k, block_n), triton.cdiv(programs, batch * heads_kv)))


@triton.jit
def _decode_split(
    Q, K, V, Mask, KPos, QPos, Part, PartM, PartL,
    sqb, sqh, sqd, skb, skh, skt, skd, svb, svh, svt, svd, smb, smh, smt,
    heads_kv, seq_k, split_len, n_splits, scale_log2, window,
    GROUP: tl.constexpr, MASK_KIND: tl.constexpr, HAS_RANGE: tl.constexpr,
    HEAD_D: tl.constexpr, HEAD_DV: tl.constexpr, BLOCK_G: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_DV: tl.constexpr,
    BLOCK_N: tl.constexpr,
):
    pid = tl.program_id(0)  # batch * heads_kv + key/value head
    split = tl.program_id(1)
    b = pid // heads_kv
    hk = pid % heads_kv
    g = tl.arange(0, BLOCK_G)
    heads = hk * GROUP + g
    g_ok = g < GROUP
    d = tl.arange(0, BLOCK_D)
    dv = tl.arange(0, BLOCK_DV)
    q = tl.load(Q + b * sqb + heads[:, None] * sqh + d[None, :] * sqd, mask=g_ok[:, None] & (d[None, :] < HEAD_D), other=0.0)
    m_i = tl.full([BLOCK_G], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_G], tl.float32)
    acc = tl.zeros([BLOCK_G, BLOCK_DV], tl.float32)
    lo = 0
    hi = seq_k
    if HAS_RANGE:  # only the rows the mask can show: up to the query's position, after query - window
        query = (tl.load(QPos) - tl.load(KPos)).to(tl.int32)  # the query's position as a row index
        hi = tl.maximum(tl.minimum(seq_k, query + 1), 0)
        lo = tl.where(window > 0, tl.maximum(query - window + 1, 0), 0)
    start = lo + split * split_len
    end = tl.minimum(start + split_len, hi)
    k_base = K + b * skb + hk * skh
    v_base = V + b * svb + hk * svh
    for n0 in range(start, end, BLOCK_N):
        n = n0 + tl.arange(0, BLOCK_N)
        n_ok = n < end
        k = tl.load(k_base + n[None, :] * skt + d[:, None] * skd, mask=n_ok[None, :] & (d[:, None] < HEAD_D), other=0.0)
        s = tl.dot(q, k, input_precision="ieee") * scale_log2  # [BLOCK_G, BLOCK_N]
        if MASK_KIND == 1:
            keep = tl.load(Mask + b * smb + heads[:, None] * smh + n[None, :] * smt, mask=g_ok[:, None] & n_ok[None, :], other=0)
            s = tl.where(keep != 0, s, float("-inf"))
        elif MASK_KIND == 2:
            bias = tl.load(Mask + b * smb + heads[:, None] * smh + n[None, :] * smt, mask=g_ok[:, None] & n_ok[None, :], other=0.0)
            # finfo.min (HF's "masked") stays finite in base 2, as in SDPA and graphopt::attention
            s = s + tl.maximum(bias.to(tl.float32) * 1.4426950408889634, -3.4028234663852886e38)
        s = tl.where(n_ok[None, :], s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, 1))
        m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)  # a row masked so far: no NaN from -inf - -inf
        p = tl.exp2(s - m_safe[:, None])
        alpha = tl.exp2(m_i - m_safe)
        l_i = l_i * alpha + tl.sum(p, 1)
        vt = tl.load(v_base + n[:, None] * svt + dv[None, :] * svd, mask=n_ok[:, None] & (dv[None, :] < HEAD_DV), other=0.0)
        acc = acc * alpha[:, None] + tl.dot(p.to(vt.dtype), vt, input_precision="ieee")
        m_i = m_new
    row = (b * heads_kv * GROUP + heads) * n_splits + split  # [B, Hq, splits] flattened
    tl.store(Part + row[:, None] * BLOCK_DV + dv[None, :], acc, mask=g_ok[:, None])
    tl.store(PartM + row, m_i, mask=g_ok)
    tl.store(PartL + row, l_i, mask=g_ok)


@triton.jit
def _decode_merge(
    Part, PartM, PartL, Out, sob, soh, sod, heads, n_splits,
    HEAD_DV: tl.constexpr, BLOCK_DV: tl.constexpr, BLOCK_S: tl.constexpr,
):
    pid = tl.program_id(0)  # batch * heads + query head
    b = pid // heads
    h = pid % heads
    s = tl.arange(0, BLOCK_S)
    s_ok = s < n_splits
    dv = tl.arange(0, BLOCK_DV)
    m = tl.load(PartM + pid * n_splits + s, mask=s_ok, other=float("-inf"))
    sums = tl.load(PartL + pid * n_splits + s, mask=s_ok, other=0.0)
    m_max = tl.max(m, 0)
    m_safe = tl.where(m_max == float("-inf"), 0.0, m_max)
    w = tl.exp2(m - m_safe)  # 0 for empty splits (m = -inf)
    total = tl.sum(sums * w, 0)
    part = tl.load(Part + (pid * n_splits + s)[:, None] * BLOCK_DV + dv[None, :], mask=s_ok[:, None], other=0.0)
    out = tl.sum(part * w[:, None], 0) / tl.where(total > 0, total, 1.0)  # nothing to attend to: zeros
    tl.store(Out + b * sob + h * soh + dv * sod, out.to(Out.dtype.element_ty), mask=dv < HEAD_DV)


def decode_attention_triton(q: Tensor, k: Tensor, v: Tensor, attn_mask: Tensor | None = None, scale: float | None = None,
                            key_positions: Tensor | None = None, query_position: Tensor | None = None, window: int = -1,
                            splits: int | None = None) -> Tensor:
    """Launch the two stages (CUDA tensors, or CPU tensors under TRITON_INTERPRET=1); `splits` overrides the split count."""
    from torch.library import wrap_triton

    check_decode_attention(q, k, v, attn_mask, key_positions, query_position)
    batch, heads, _, head_d = q.shape
    heads_kv, seq_k, head_dv = k.shape[1], k.shape[2], v.shape[3]
    out = _new_output(q, v)
    if out.numel() == 0:
        return out
    if scale is None:
        scale = 1.0 / math.sqrt(head_d)
    group = heads // heads_kv
    block_n = 16 if INTERPRET else 64
    has_range = key_positions is not None and query_position is not None
    span = min(seq_k, window) if has_range and window > 0 else seq_k  # the rows a query can see
    n_splits = splits if splits is not None else num_splits(batch, heads_kv, span, block_n)
    n_splits = max(1, min(n_splits, triton.cdiv(span, block_n)))
    split_len = triton.cdiv(triton.cdiv(span, n_splits), block_n) * block_n
    n_splits = triton.cdiv(span, split_len)
    block_dv = max(16, next_power_of_2(head_dv))
    part = torch.empty(batch * heads * n_splits, block_dv, device=q.device, dtype=torch.float32)
    part_m = torch.empty(batch * heads * n_splits, device=q.device, dtype=torch.float32)
    part_l = torch.empty_like(part_m)
    if attn_mask is None:
        mask_kind, mask, mask_strides = _NO_MASK, q, (0, 0, 0)
    else:
        mask_kind = _BOOL_MASK if attn_mask.dtype == torch.bool else _ADDITIVE_MASK
        mask = attn_mask.expand(batch, heads, 1, seq_k)  # a view: broadcast dims get stride 0
        mask_strides = (mask.stride(0), mask.stride(1), mask.stride(3))
    positions = (key_positions, query_position) if has_range else (q, q)
    wrap_triton(_decode_split)[(batch * heads_kv, n_splits)](
        q, k, v, mask, *positions, part, part_m, part_l,
        q.stride(0), q.stride(1), q.stride(3), k.stride(0), k.stride(1), k.stride(2), k.stride(3),
        v.stride(0), v.stride(1), v.stride(2), v.stride(3), *mask_strides,
        heads_kv, seq_k, split_len, n_splits, scale * _LOG2E, window if has_range else -1,
        GROUP=group, MASK_KIND=mask_kind, HAS_RANGE=has_range, HEAD_D=head_d, HEAD_DV=head_dv, BLOCK_G=max(16, next_power_of_2(group)),
        BLOCK_D=max(16, next_power_of_2(head_d)), BLOCK_DV=block_dv, BLOCK_N=block_n,
    )
    wrap_triton(_decode_merge)[(batch * heads,)](
        part, part_m, part_l, out, out.stride(0), out.stride(1), out.stride(3), heads, n_splits,
        HEAD_DV=head_dv, BLOCK_DV=block_dv, BLOCK_S=max(2, next_power_of_2(n_splits)),
    )
    return out
