"""Native helpers for gates.pdll (SwiGLU, GeGLU)."""

from __future__ import annotations

import numpy as np

from graphopt.pattern.native import RewriteDeclined, native_constraint, native_rewrite

_INT64_MAX = np.iinfo(np.int64).max


def _slice_range(ctx, starts, ends, axes, steps, rank: int, dim: int) -> tuple[int, int, int, int] | str:
    """One constant Slice as (axis, start, stop, step), clamped to a dim of size `dim` (the sliced axis)."""
    got = ctx.one_axis_slice(starts, ends, axes, steps, rank)
    if isinstance(got, str):
        return got
    axis, start, stop, step = got
    start = max(0, min(dim, start + dim if start < 0 else start))
    stop = max(0, min(dim, stop + dim if stop < 0 else stop))
    return axis, start, stop, step


@native_constraint("SwiGLUForm")
def swiglu_form(ctx, form, alpha):
    """Swish / QuickGelu are SiLU only with alpha 1."""
    if form != "mul" and (alpha is None or not np.isclose(float(alpha), 1.0)):
        return f"the {form} activation has alpha {alpha}, SiLU needs 1"
    return True


@native_constraint("GeGLUHalves")
def geglu_halves(ctx, x, form, form2, axis, nout, sizes, hs, he, ha, hp, gs, ge, ga, gp):
    """Both halves come from one Split into two equal parts, or two Slices [0, D/2) and
    [D/2, D), of x's static, even last axis; the first half is the multiplier, the
    second goes through the GELU (BiasSplitGelu's order)."""
    if form != form2:
        return f"the halves are cut differently ({form} / {form2})"
    shape = ctx.shape(x)
    if shape is None or not shape or not isinstance(shape[-1], int):
        return "the last dim of the projection is not static"
    rank, dim = len(shape), shape[-1]
    if dim % 2:
        return f"the last dim {dim} is odd"
    half = dim // 2
    if form == "split":
        axis = 0 if axis is None else int(axis)
        if axis not in (-1, rank - 1):
            return f"the Split cuts axis {axis}, not the last one (rank {rank})"
        if sizes is not None:
            got = ctx.ints(sizes)
            if got != [half, half]:
                return f"the Split sizes are {got}, not two halves [{half}, {half}]"
            return True
        if nout is not None and int(nout) == 2:
            return True
        return f"the Split makes {nout} parts, not 2" if nout is not None else "the Split has neither sizes nor num_outputs: the number of parts is not known here"
    for name, cut, want in (("first", (hs, he, ha, hp), (0, half)), ("second", (gs, ge, ga, gp), (half, dim))):
        got = _slice_range(ctx, *cut, rank, dim)
        if isinstance(got, str):
            return got
        if got[0] != rank - 1 or got[3] != 1:
            return f"the {name} Slice cuts axis {got[0]} with step {got[3]}, not the last axis with step 1"
        if got[1:3] != want:
            return f"the {name} Slice takes [{got[1]}, {got[2]}) of the last axis, expected [{want[0]}, {want[1]})"
    return True


@native_rewrite("ZeroBias")
def zero_bias(ctx, x):
    """A zero bias [D] of x's dtype (BiasSplitGelu's bias is required)."""
    shape = ctx.shape(x)
    dtype = {"f32": np.float32, "f16": np.float16, "bf16": None, "f64": np.float64}.get(ctx.dtype(x) or "", None)
    if dtype is None or shape is None or not isinstance(shape[-1], int):
        raise RewriteDeclined(f"no zero bias for a {ctx.dtype(x)} projection of shape {shape}")
    return {"bias": np.zeros(shape[-1], dtype)}
