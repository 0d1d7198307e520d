"""Native helpers for normalization.pdll."""

from __future__ import annotations

import numpy as np

from graphopt.ir.dtypes import onnx_enum_to_name
from graphopt.ir.symbolic import dims_equal
from graphopt.pattern.native import RewriteDeclined, native_constraint, native_rewrite


def _static_rank(ctx, x):
    return ctx.rank(x)


@native_constraint("ReducesLastAxis")
def reduces_last_axis(ctx, x, axes_attr, axes_input):
    """The ReduceMean reduces exactly the last axis of x (axes as attribute or as a constant input)."""
    if axes_attr is not None:
        axes = [int(a) for a in np.asarray(axes_attr).reshape(-1)]
    elif axes_input is not None:
        array = ctx.array(axes_input)
        if array is None:
            return "the axes are not constant"
        axes = [int(a) for a in array.reshape(-1)]
    else:
        return "the ReduceMean has no axes (it reduces every axis)"
    if axes == [-1]:
        return True
    rank = _static_rank(ctx, x)
    if rank is not None and axes == [rank - 1]:
        return True
    return f"the ReduceMean reduces axes {axes}, not only the last one (rank {rank})"


@native_constraint("IsSquare")
def is_square(ctx, form, exponent):
    """Mul(d, d) squares; Pow(d, e) only when e is the constant 2."""
    if form == "mul":
        return True
    array = ctx.array(exponent)
    if array is None or array.size != 1:
        return "the exponent is not a one-element constant"
    actual = float(array.reshape(-1)[0])
    if actual != 2.0:
        return f"the exponent is {actual}, not 2"
    return True


@native_constraint("SameStaticShape")
def same_static_shape(ctx, a, b):
    """a and b have the same known shape (static dims equal, symbolic dims the same name)."""
    recorded = ctx.same_recorded_shape(a, b)
    if recorded is False:
        return f"the shapes are not known to be equal: {ctx.shape_text(a)} vs {ctx.shape_text(b)}"
    if recorded is None:
        sa, sb = ctx.dims(a), ctx.dims(b)
        if sa is None or sb is None:
            return "a shape is unknown"
        if not dims_equal(sa, sb):
            return f"the shapes are not known to be equal: {list(sa)} vs {list(sb)}"
    if ctx.dtype(a) != ctx.dtype(b):
        return f"the dtypes differ: {ctx.dtype(a)} vs {ctx.dtype(b)}"
    return True


@native_constraint("IsLastAxis")
def is_last_axis(ctx, x, axis):
    rank = ctx.rank(x)
    axis = -1 if axis is None else int(axis)
    if axis == -1 or (rank is not None and axis == rank - 1):
        return True
    return f"normalizes axis {axis}, not the last one (rank {rank})"


@native_rewrite("ScalarOf")
def scalar_of(ctx, c):
    array = ctx.array(c)
    if array is None or array.size != 1:
        raise RewriteDeclined("not a one-element constant")
    value = float(array.reshape(-1)[0])
    if array.dtype == np.float64 and float(np.float32(value)) != value:
        # The fused ops' epsilon is a float32 attribute; rounding a float64 model's epsilon moves
        # its outputs by up to 1e-8 where the variance is small, past float64's tolerance.
        raise RewriteDeclined(f"epsilon {value:g} is float64, and the fused op's float32 epsilon attribute would round it")
    return {"value": value}


@native_constraint("IsOne")
def is_one(ctx, form, one):
    """Div(1, sqrt) takes the reciprocal only when the dividend is the constant 1."""
    if form != "div1":
        return True
    array = ctx.array(one)
    if array is None or array.size != 1:
        return "the dividend is not a one-element constant"
    actual = float(array.reshape(-1)[0])
    if actual != 1.0:
        return f"the dividend is {actual}, not 1"
    return True


@native_constraint("IsAbsent")
def is_absent(ctx, x):
    """The optional input is not there (the op has no bias yet)."""
    return True if x is None else "the op already has this input"


# How far `NotComputedFrom` looks back before it stops trusting the answer.
_ANCESTOR_BUDGET = 512


@native_constraint("NotComputedFrom")
def not_computed_from(ctx, x, source):
    """`x` (e.g. a norm's scale) is not computed from `source` (the sum the fused op returns):
    the fused op would then read its own output. Constants and graph inputs pass at once."""
    if x is None or ctx.array(x) is not None:
        return True
    view = ctx.view
    stack, seen = [x], set()
    while stack:
        value = stack.pop()
        if value is source:
            return f"{getattr(x, 'name', 'the value')} is computed from the sum the fused op would replace"
        if id(value) in seen:
            continue
        seen.add(id(value))
        if len(seen) > _ANCESTOR_BUDGET:
            return f"cannot prove {getattr(x, 'name', 'the value')} independent of the sum (more than {_ANCESTOR_BUDGET} ancestors)"
        node = view.producer(value)
        if node is not None:
            stack.extend(v for v in view.inputs(node) if v is not None)
    return True


@native_constraint("IsUpcastAndBack")
def is_upcast_and_back(ctx, h, up, down):
    """h is half precision, cast up to float32 and the result cast back to h's type."""
    source = ctx.dtype(h)
    if source not in ("f16", "bf16"):
        return f"the input is {source or 'of unknown type'}, not f16/bf16"
    if onnx_enum_to_name(up) != "f32":
        return f"the upcast is to {onnx_enum_to_name(up)}, not f32"
    if onnx_enum_to_name(down) != source:
        return f"the result is cast to {onnx_enum_to_name(down)}, not back to {source}"
    return True


@native_constraint("IsZeroScalar")
def is_zero_scalar(ctx, z):
    """An absent clamp (no Max in the match), or a Max against the constant 0."""
    if z is None:
        return True
    value = ctx.array(z)
    if value is None:
        return "the clamp is not a constant"
    return True if np.all(value == 0) else f"clamps at {float(value.ravel()[0]):g}, not 0"
