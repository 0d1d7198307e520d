"""Native helpers for attention.pdll."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from graphopt.ir.dtypes import numpy_dtype
from graphopt.ir.symbolic import broadcast_dims, dims_equal, static_int
from graphopt.pattern.native import Attr, OpType, RewriteDeclined, Tag, Value, native_constraint, native_rewrite

# Ops that only move or broadcast values (a constant stays what it is through them).
_MOVES_VALUES = frozenset({"Expand", "Reshape", "Unsqueeze", "Squeeze", "Cast", "Identity", "Transpose", "Tile"})
# Ops through which a mask with finite values stays finite (they move or select
# values, never add them: finfo.min + finfo.min would be -inf).
_FINITE_PRESERVING = _MOVES_VALUES | {"Where", "Slice", "Gather", "Concat"}


@native_constraint("IsZero")
def is_zero(ctx, guard, zero):
    if guard != "isnan":
        return True
    return True if ctx.scalar(zero) == 0.0 else "the NaN guard does not write 0"


@dataclass(frozen=True)
class AttentionShapesArgs:
    q: Value  # [batch, heads, seq, head_size]
    kt: Value  # k transposed: [batch, heads, head_size, seq_kv]
    v: Value  # [batch, heads, seq_kv, v_head_size]
    masking: Tag  # add, add2, keep, drop or none
    mask: Value  # the added mask (add, add2)
    mask2: Value  # the second added mask (add2)
    keep: Value  # the Where condition (keep, drop)
    axis: Attr  # the Softmax axis


@native_constraint("AttentionShapes", params=AttentionShapesArgs)
def attention_shapes(ctx, m: AttentionShapesArgs):
    """q [B, N, S, H], k transposed [B, N, H, L], v [B, N, L, Hv] with static N, H, Hv; Softmax over
    the last axis; a mask that onnxruntime's attention_bias accepts: [B|1, N|1, S, L], or of
    rank 2 or 3 and that once unsqueezed on the left to rank 4."""
    q, masking, mask, keep = m.q, m.masking, m.mask, m.keep
    dq, dk, dv = ctx.dims(q), ctx.dims(m.kt), ctx.dims(m.v)
    if dq is None or dk is None or dv is None:
        return "the dims of q, k or v are not known"
    if not (len(dq) == len(dk) == len(dv) == 4):
        return f"q, k, v have ranks {len(dq)}, {len(dk)}, {len(dv)}; expected 4 ([batch, heads, seq, head_size])"
    heads, head_size, v_head_size = static_int(dq[1]), static_int(dq[3]), static_int(dv[3])
    if heads is None or head_size is None or v_head_size is None:
        return f"the number of heads or the head size is not static (q {list(dq)}, v {list(dv)})"
    if not dims_equal([dk[1]], [dq[1]]) or not dims_equal([dv[1]], [dq[1]]):
        return f"k and v have {dk[1]} and {dv[1]} heads, q has {heads} (grouped-query attention without repeated k/v)"
    if not dims_equal([dk[2]], [dq[3]]):
        return f"the key is not transposed like q k^T: k {list(dk)}, q {list(dq)}"
    if not dims_equal([dk[3]], [dv[2]]):
        return f"k and v have different sequence lengths ({dk[3]}, {dv[2]})"
    if not dims_equal([dk[0]], [dq[0]]) or not dims_equal([dv[0]], [dq[0]]):
        return f"q, k and v batch sizes are not known to be equal ({dq[0]}, {dk[0]}, {dv[0]}); the fused op does not broadcast them"
    if m.axis not in (-1, 3):
        return f"the Softmax is over axis {m.axis}, not the last"
    bias = mask if masking in ("add", "add2") else keep if masking in ("keep", "drop") else None
    if bias is not None:
        db = _mask_dims(ctx, masking, mask, m.mask2, keep)
        needs = f"onnxruntime needs [batch or 1, heads or 1, {dq[2]}, {dk[3]}]"
        if db is None or len(db) != 4:
            needs += " (a lower rank aligned on the right)"
        if db is None or not 2 <= len(db) <= 4:
            return f"the mask has dims {db}; {needs}"
        # Added to [B, N, S, L] scores, a mask of rank < 4 broadcasts as if unsqueezed on the
        # left to rank 4; the rewrite gives the fused op that unsqueezed mask.
        d4 = [1] * (4 - len(db)) + list(db)
        ok = (static_int(d4[0]) == 1 or dims_equal([d4[0]], [dq[0]])) and (
            static_int(d4[1]) == 1 or dims_equal([d4[1]], [dq[1]])) and dims_equal(d4[2:], [dq[2], dk[3]])
        if not ok:
            return f"the mask has dims {list(db)}; {needs}"
        for added in (mask, m.mask2) if masking in ("add", "add2") else ():
            if added is not None and ctx.dtype(added) != ctx.dtype(q):
                return f"the mask is {ctx.dtype(added)}, q is {ctx.dtype(q)}"
        if masking in ("keep", "drop") and ctx.dtype(keep) != "bool":
            return f"the Where condition is {ctx.dtype(keep)}, not bool"
    return True


def _mask_dims(ctx, masking, mask, mask2, keep):
    """The dims of the bias the fused op gets: the added mask (two added masks broadcast
    together), or the Where condition (made an additive mask of its shape)."""
    if masking in ("keep", "drop"):
        return ctx.dims(keep)
    dims = ctx.dims(mask)
    if masking == "add2":
        dims = broadcast_dims([dims, ctx.dims(mask2)])
    return dims


def _is_finite(ctx, value, depth: int = 0) -> bool:
    """The value provably holds no inf or NaN: finite constants, moved or selected by shape ops."""
    if value is None:
        return True
    arr = ctx.array(value)
    if arr is not None:
        return arr.dtype.kind in "biu" or bool(np.all(np.isfinite(arr)))
    if ctx.dtype(value) == "bool" or (ctx.dtype(value) or "").startswith(("i", "u")):
        return True
    view = ctx.view
    node = view.producer(value)
    if node is None or depth > 32:
        return False
    domain, op = view.op_key(node)
    if domain or op not in _FINITE_PRESERVING:
        return False
    ins = list(view.inputs(node))
    data = ins[1:] if op == "Where" else ins[:1]
    return all(_is_finite(ctx, x, depth + 1) for x in data)


def _all_true(ctx, value, depth: int = 0) -> bool:
    """A boolean tensor provably all true: a constant, moved or broadcast (never a run-time input)."""
    arr = ctx.array(value)
    if arr is not None:
        return arr.dtype == np.bool_ and bool(arr.all())
    node = ctx.view.producer(value)
    if node is None or depth > 16:
        return False
    domain, op = ctx.view.op_key(node)
    ins = list(ctx.view.inputs(node))
    if domain or not ins:
        return False
    if op in _MOVES_VALUES:
        return _all_true(ctx, ins[0], depth + 1)
    if op == "And":
        return all(_all_true(ctx, x, depth + 1) for x in ins)
    return False


def _masks_nothing(ctx, masking, mask, keep) -> bool:
    """The mask leaves every score as it is: Where(all-true, 0, _) added, or a Where keeping all."""
    if masking in ("keep",):
        return _all_true(ctx, keep)
    if masking != "add" or mask is None:
        return False
    const = ctx.array(mask)
    if const is not None:
        return not const.any()
    node = ctx.view.producer(mask)
    while node is not None and ctx.view.op_key(node)[1] in _MOVES_VALUES and not ctx.view.op_key(node)[0]:
        node = ctx.view.producer(ctx.view.inputs(node)[0])
    if node is None or ctx.view.op_key(node) != ("", "Where"):
        return False
    cond, yes, _ = ctx.view.inputs(node)
    zero = ctx.array(yes)
    return zero is not None and not zero.any() and _all_true(ctx, cond)


def _swamps_scores(ctx, fill) -> bool:
    """Adding `fill` to any score gives `fill` itself (in float32, where the kernels add the bias):
    -inf, or about float32's lowest value (finfo.min, what masked_fill exports write), whose
    rounding step (2**104) dwarfs any score. float16's finfo.min (-65504) is not low enough."""
    value = ctx.scalar(fill)
    return value is not None and value <= -1e38


@dataclass(frozen=True)
class AttentionMatch:
    """What FuseAttention bound, as AttentionParams reads it."""

    q: Value
    v: Value
    qop: OpType  # "Mul" or "Div": q scaled by sq (None: q not scaled)
    sq: Value
    kop: OpType  # k scaled by sk
    sk: Value
    sop: OpType  # the scores scaled by ss
    ss: Value
    guard: Tag  # isnan: Where(IsNaN(p), 0, p) after the Softmax; none
    masking: Tag  # add, add2, keep, drop, none
    mask: Value
    mask2: Value
    keep: Value
    fill: Value


@dataclass(frozen=True)
class AttentionPlan:
    """What the rewrite reads back (`a.scale`, `alt a.mask {...}`)."""

    scale: Attr
    heads: Attr
    to_bsd: Value  # Reshape target [batch, seq, heads * head_size]
    to_bnsh: Value  # Reshape target [batch, seq, heads, v_head_size]
    zero: Value  # 0 in q's dtype
    guard: Tag  # keep or drop: whether the output keeps the NaN guard
    mask: Tag  # used or nothing: whether the fused op needs the mask at all
    mask_rank: Tag  # four, or lower: the mask is unsqueezed on the left to rank 4 (onnxruntime's attention_bias)
    mask_axes: Value  # the Unsqueeze axes (opset >= 13: an input)
    mask_axes_attr: Attr  # the same axes (opset < 13: an attribute)


@native_rewrite("AttentionParams", params=AttentionMatch, results=AttentionPlan)
def attention_params(ctx, m: AttentionMatch) -> AttentionPlan:
    if m.masking in ("keep", "drop") and not _swamps_scores(ctx, m.fill):
        # Where(mask, scores, fill) replaces the masked scores; the fused op adds a bias to them.
        # On a row with every position masked the first gives uniform weights, the second the
        # unmasked softmax, unless the bias swamps the scores.
        raise RewriteDeclined(f"the Where mask fills {ctx.scalar(m.fill)}, which added to the scores does not swamp them (a fully masked row would differ)")
    scale = 1.0
    for op, factor in ((m.qop, m.sq), (m.kop, m.sk), (m.sop, m.ss)):
        if op == "Mul":
            scale *= ctx.scalar(factor)
        elif op == "Div":
            scale /= ctx.scalar(factor)
    q_dims, v_dims = ctx.dims(m.q), ctx.dims(m.v)
    heads, v_head_size = static_int(q_dims[1]), static_int(v_dims[3])  # checked static by AttentionShapes
    # Two added masks may overflow to -inf together (finfo.min + a negative bias).
    mask_finite = m.masking == "none" or (m.masking != "add2" and _is_finite(ctx, m.mask if m.masking == "add" else m.fill))
    mask_dims = None if m.masking == "none" else _mask_dims(ctx, m.masking, m.mask, m.mask2, m.keep)
    missing = 0 if mask_dims is None else 4 - len(mask_dims)  # rank checked in 2..4 by AttentionShapes
    return AttentionPlan(
        scale=float(scale),
        heads=int(heads),  # type: ignore[arg-type]
        to_bsd=np.array([0, 0, -1], dtype=np.int64),
        to_bnsh=np.array([0, 0, heads, v_head_size], dtype=np.int64),
        zero=np.zeros((), dtype=numpy_dtype(ctx.dtype(m.q))),
        # The output keeps the NaN guard unless no row can be fully masked.
        guard="keep" if m.guard == "isnan" and not mask_finite else "drop",
        mask="nothing" if _masks_nothing(ctx, m.masking, m.mask, m.keep) else "used",
        mask_rank="lower" if missing > 0 else "four",
        mask_axes=np.arange(missing, dtype=np.int64),
        mask_axes_attr=list(range(missing)),
    )


def _grows_a_cache(ctx, value, seq_axis: int) -> bool:
    """value (k^T or v) is a Concat, through ops that only move values, of a graph input and more
    on the axis that becomes the attention's key positions (its dim there is value's seq_axis)."""
    view = ctx.view
    length = (ctx.dims(value) or [None] * 4)[seq_axis]
    node = view.producer(value)
    for _ in range(8):
        if node is None or view.op_key(node)[1] not in _MOVES_VALUES:
            break
        node = view.producer(view.inputs(node)[0])
    if node is None or view.op_key(node) != ("", "Concat") or length is None:
        return False
    cat = view.outputs(node)[0]
    dims = ctx.dims(cat)
    axis = view.attrs(node).get("axis")
    if dims is None or not isinstance(axis, int) or not dims_equal([dims[axis]], [length]):
        return False
    return any(_is_graph_input(ctx, x) for x in view.inputs(node))


def _is_graph_input(ctx, value) -> bool:
    """A value fed from outside (no producer, not a constant), through ops that only move values."""
    for _ in range(8):
        if value is None:
            return False
        node = ctx.view.producer(value)
        if node is None:
            return ctx.array(value) is None
        if ctx.view.op_key(node)[1] not in _MOVES_VALUES:
            return False
        value = ctx.view.inputs(node)[0]
    return False


@native_rewrite("GrowingKvCache")
def growing_kv_cache(ctx, kt, v):
    """kv_cache = 1 when k or v grows each call (a Concat of a graph input on the key axis), else
    the attribute is left out."""
    grows = _grows_a_cache(ctx, kt, 3) or _grows_a_cache(ctx, v, 2)
    return {"kv_cache": 1 if grows else None}


@native_constraint("PackableProjections")
def packable_projections(ctx, x, wq, bq, wk, bk, wv, bv):
    """x [batch, seq, hidden]; each weight [hidden, hidden] and bias [hidden], one dtype."""
    dx = ctx.dims(x)
    if dx is None or len(dx) != 3 or static_int(dx[2]) is None:
        return f"the input has dims {dx}; com.microsoft.Attention needs [batch, seq, hidden] with a static hidden size"
    hidden = static_int(dx[2])
    arrays = [ctx.array(w) for w in (wq, wk, wv)]
    biases = [ctx.array(b) for b in (bq, bk, bv)]
    if any(w is None or w.shape != (hidden, hidden) for w in arrays):
        return f"the projection weights are {[None if w is None else list(w.shape) for w in arrays]}, not [{hidden}, {hidden}]"
    if any(b is None or b.shape != (hidden,) for b in biases):
        return f"the biases are {[None if b is None else list(b.shape) for b in biases]}, not [{hidden}]"
    if len({a.dtype for a in (*arrays, *biases)}) != 1 or ctx.dtype(x) != ctx.dtype(wq):
        return "the input, weights and biases do not share one dtype"
    return True


@native_rewrite("PackQKV")
def pack_qkv(ctx, wq, bq, wk, bk, wv, bv):
    return {
        "w": np.concatenate([ctx.array(w) for w in (wq, wk, wv)], axis=1),
        "b": np.concatenate([ctx.array(b) for b in (bq, bk, bv)]),
    }


@native_constraint("IsPackedProjection")
def is_packed_projection(ctx, x, w, proj, sizes, axis):
    """x [batch, seq, hidden] flattened, times w [hidden, 3 * hidden], reshaped back to
    [batch, seq, 3 * hidden] and split in three equal parts along the last axis."""
    dx, dp = ctx.dims(x), ctx.dims(proj)
    weights = ctx.array(w)
    if dx is None or dp is None or len(dx) != 3 or len(dp) != 3 or static_int(dx[2]) is None:
        return f"the projection's input and output dims are {dx} and {dp}, not [batch, seq, hidden]"
    hidden = static_int(dx[2])
    if weights is None or weights.shape != (hidden, 3 * hidden):
        return f"the weights are {None if weights is None else list(weights.shape)}, not [{hidden}, {3 * hidden}]"
    if not dims_equal(dp, [dx[0], dx[1], 3 * hidden]):
        return f"the projection {list(dp)} does not restore the input's leading dims {list(dx)}"
    if axis not in (-1, 2):
        return f"the split is along axis {axis}, not the last"
    split = ctx.array(sizes) if sizes is not None else None
    if sizes is not None and (split is None or [int(s) for s in split.reshape(-1)] != [hidden] * 3):
        return f"the split sizes are {None if split is None else split.tolist()}, not three of {hidden}"
    return True
