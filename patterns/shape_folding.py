"""Native helpers for shape_folding.pdll."""

from __future__ import annotations

import numpy as np

from graphopt.pattern.native import native_constraint, native_rewrite


def _dims(ctx, x, start, end):
    shape = ctx.shape(x)
    if shape is None:
        return None
    rank = len(shape)
    lo = 0 if start is None else max(0, min(rank, start + rank if start < 0 else start))
    hi = rank if end is None else max(0, min(rank, end + rank if end < 0 else end))
    return shape[lo:hi]


@native_constraint("ShapeIsStatic")
def shape_is_static(ctx, x, start, end):
    dims = _dims(ctx, x, start, end)
    if dims is None:
        return "the rank is unknown"
    symbolic = [d for d in dims if not isinstance(d, int)]
    return True if not symbolic else f"dims {symbolic} are not static"


@native_constraint("AllDimsStatic")
def all_dims_static(ctx, x):
    return shape_is_static(ctx, x, None, None)


@native_rewrite("ShapeConstant")
def shape_constant(ctx, x, start, end):
    return {"value": np.asarray(_dims(ctx, x, start, end), dtype=np.int64)}


@native_rewrite("SizeConstant")
def size_constant(ctx, x):
    return {"value": np.asarray(int(np.prod(ctx.shape(x), dtype=np.int64)), dtype=np.int64)}


@native_constraint("GatheredDimsAreStatic")
def gathered_dims_are_static(ctx, x, start, indices, axis):
    dims = _dims(ctx, x, start, None)
    if dims is None:
        return "the rank is unknown"
    picked = ctx.array(indices)
    if picked is None or picked.dtype.kind not in "iu":
        return "the indices are not constant integers"
    n = len(dims)
    if np.any(picked < -n) or np.any(picked >= n):
        return "the indices are out of range"
    chosen = [dims[int(i)] for i in picked.reshape(-1)]
    symbolic = [d for d in chosen if not isinstance(d, int)]
    return True if not symbolic else f"gathered dims {symbolic} are not static"


@native_rewrite("GatheredDims")
def gathered_dims(ctx, x, start, indices):
    dims = np.asarray(_dims(ctx, x, start, None), dtype=np.int64)
    return {"value": dims[ctx.array(indices)]}
