"""Native helpers for sdpa.pdll."""

from __future__ import annotations

import numpy as np

from graphopt.ir.symbolic import SymbolicShapes, dims_equal, static_int
from graphopt.pattern.native import native_constraint, native_rewrite


@native_constraint("SdpaShapes")
def sdpa_shapes(ctx, q, k, v, mask):
    """q [B, Hq, S, D], k [B, Hkv, T, D], v [B, Hkv, T, Dv] with Hq a multiple of Hkv, one float
    dtype; a mask (bool or the same float type) that broadcasts to [B, Hq, S, T]."""
    sym = SymbolicShapes(ctx.view)
    dq, dk, dv = sym.dims(q), sym.dims(k), sym.dims(v)
    if dq is None or dk is None or dv is None:
        return "the dims of q, k or v are not known"
    if not (dims_equal([dk[0]], [dq[0]]) and dims_equal([dv[0]], [dq[0]])):
        return f"q, k and v batch sizes are not known to be equal ({dq[0]}, {dk[0]}, {dv[0]})"
    if not dims_equal(dk[1:3], dv[1:3]):
        return f"k {list(dk)} and v {list(dv)} differ in heads or length"
    if not dims_equal([dk[3]], [dq[3]]):
        return f"q and k head sizes differ ({dq[3]}, {dk[3]})"
    heads, kv_heads = static_int(dq[1]), static_int(dk[1])
    if heads is None or kv_heads is None or kv_heads == 0 or heads % kv_heads:
        return f"{dq[1]} query heads are not a multiple of {dk[1]} key/value heads"
    dtypes = {ctx.dtype(q), ctx.dtype(k), ctx.dtype(v)}
    if len(dtypes) != 1 or not dtypes <= {"f16", "bf16", "f32"}:
        return f"q, k and v are {sorted(map(str, dtypes))}, not one of f16, bf16, f32"
    if mask is not None:
        dm = sym.dims(mask)
        full = [dq[0], dq[1], dq[2], dk[2]]
        if dm is None or len(dm) > 4:
            return f"the mask has dims {dm}, not at most 4"
        for got, want in zip(reversed(dm), reversed(full)):
            if static_int(got) != 1 and not dims_equal([got], [want]):
                return f"the mask {list(dm)} does not broadcast to {full}"
        if ctx.dtype(mask) not in ("bool", ctx.dtype(q)):
            return f"the mask is {ctx.dtype(mask)}, q is {ctx.dtype(q)}"
    return True


def _shape_operand(ctx, shape):
    """A Reshape's target shape as a comparable tuple (constant ints, or the symbolic list)."""
    array = ctx.array(shape)
    if array is not None:
        return tuple(int(d) for d in array.reshape(-1))
    raw = getattr(shape, "raw", None)
    return tuple(raw) if isinstance(raw, (list, tuple)) else None


@native_constraint("PackableGemms")
def packable_gemms(ctx, x, fq, wq, bq, fk, wk, bk, fv, wv, bv):
    """The three projections flatten x the same way; weights [hidden, n_i] with one hidden
    size and biases [n_i], all of one dtype."""
    flat = [_shape_operand(ctx, f) for f in (fq, fk, fv)]
    if flat[0] is None or flat.count(flat[0]) != 3:
        return f"the projections flatten the input differently ({flat})"
    weights = [ctx.array(w) for w in (wq, wk, wv)]
    biases = [ctx.array(b) for b in (bq, bk, bv)]
    if any(w is None or w.ndim != 2 for w in weights) or len({w.shape[0] for w in weights}) != 1:
        return f"the weights are {[None if w is None else list(w.shape) for w in weights]}, not [hidden, n] with one hidden size"
    if any(b is None or b.shape != (w.shape[1],) for b, w in zip(biases, weights)):
        return "each bias is not one value per output column of its weight"
    if len({a.dtype for a in (*weights, *biases)}) != 1:
        return "the weights and biases do not share one dtype"
    return True


@native_rewrite("PackGemms")
def pack_gemms(ctx, wq, bq, wk, bk, wv, bv):
    weights = [ctx.array(w) for w in (wq, wk, wv)]
    return {
        "w": np.concatenate(weights, axis=1),
        "b": np.concatenate([ctx.array(b) for b in (bq, bk, bv)]),
        "sizes": np.array([w.shape[1] for w in weights], dtype=np.int64),
    }


def _repeated_heads(ctx, x, unsqueeze_axes, expanded, repeated):
    """The group size g when `repeated` is x [B, H, T, D] with each head copied g times in
    place (head h of the result is head h // g of x), else why not."""
    dx, de, dr = ctx.dims(x), ctx.dims(expanded), ctx.dims(repeated)
    axes = ctx.ints(unsqueeze_axes)
    if dx is None or de is None or dr is None or len(dx) != 4 or len(de) != 5 or len(dr) != 4:
        return f"not a 4-D tensor expanded on a new axis and reshaped back to 4-D ({dx}, {de}, {dr})"
    if axes is None or len(axes) != 1 or axes[0] % 5 != 2:
        return f"the new axis is {axes}, not 2 (right after the heads: a copy in the interleaved order)"
    if not dims_equal([de[0], de[1], de[3], de[4]], dx):
        return f"the expand {list(de)} changes more than the new axis of {list(dx)}"
    heads, group = static_int(dx[1]), static_int(de[2])
    if heads is None or group is None or group < 1:
        return f"the head count {dx[1]} or the group {de[2]} is not a known int"
    if not dims_equal(dr, [dx[0], heads * group, dx[2], dx[3]]):
        return f"the reshape {list(dr)} does not merge the heads with the copies ({list(dx)}, group {group})"
    return group


@native_constraint("RepeatedHeads")
def repeated_heads(ctx, k, ku, ke, kr, v, vu, ve, vr):
    """k and v each repeated on the heads, interleaved, by one group size."""
    gk = _repeated_heads(ctx, k, ku, ke, kr)
    if isinstance(gk, str):
        return f"k: {gk}"
    gv = _repeated_heads(ctx, v, vu, ve, vr)
    if isinstance(gv, str):
        return f"v: {gv}"
    if gk != gv:
        return f"k is repeated {gk} times, v {gv} times"
    return True
