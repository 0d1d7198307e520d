"""Native helpers for hard_activations.pdll: the constants of the written-out forms."""

from __future__ import annotations

import numpy as np

from graphopt.pattern.native import RewriteDeclined, native_constraint, native_rewrite


def _float(ctx, value) -> float | None:
    """A scalar bound either to a constant value (an input) or to an attribute (a number)."""
    if value is None:
        return None
    if isinstance(value, (int, float, np.floating, np.integer)):
        return float(value)
    array = ctx.array(value)
    if array is None or array.size != 1 or array.dtype.kind != "f":
        return None
    return float(array.reshape(-1)[0])


def _near(a: float | None, b: float) -> bool:
    return a is not None and bool(np.isclose(a, b, rtol=1e-5, atol=1e-7))


def _clip_bounds(ctx, b, lo, hi, lo_attr, hi_attr, s, scale) -> tuple[float, float, float] | str:
    """(offset b, ceiling c, scale 1/c) of clip(x + b, 0, c) / c, or why the constants do not make one.
    The Clip's bounds are inputs (opset >= 11) or attributes (before)."""
    low = _float(ctx, lo) if lo is not None else _float(ctx, lo_attr)
    high = _float(ctx, hi) if hi is not None else _float(ctx, hi_attr)
    offset, factor = _float(ctx, b), _float(ctx, s)
    if offset is None or factor is None:
        return "the offset or the scale is not a float constant"
    if low is None or not _near(low, 0.0):
        return f"the Clip's lower bound is {low}, expected 0"
    if high is None or high <= 0:
        return f"the Clip's upper bound is {high}, expected a positive number"
    inverse = 1.0 / factor if scale == "Div" else factor
    if not _near(inverse * high, 1.0):
        return f"the result is scaled by {inverse:g}, expected 1/{high:g} (the Clip's upper bound)"
    return offset, high, inverse


@native_constraint("HardSigmoidConstants")
def hard_sigmoid_constants(ctx, b, lo, hi, lo_attr, hi_attr, s, scale):
    """clip(x + b, 0, c) scaled by 1/c: a HardSigmoid for any offset b and ceiling c."""
    bounds = _clip_bounds(ctx, b, lo, hi, lo_attr, hi_attr, s, scale)
    return bounds if isinstance(bounds, str) else True


@native_rewrite("HardSigmoidAttrs")
def hard_sigmoid_attrs(ctx, b, hi, hi_attr):
    offset = _float(ctx, b)
    high = _float(ctx, hi) if hi is not None else _float(ctx, hi_attr)
    if offset is None or high is None:
        raise RewriteDeclined("the Clip's constants are unknown")
    return {"alpha": 1.0 / high, "beta": offset / high}


@native_constraint("HardSwishConstants")
def hard_swish_constants(ctx, b, lo, hi, lo_attr, hi_attr, s, scale):
    """x * clip(x + 3, 0, 6) / 6: HardSwish has exactly these constants."""
    bounds = _clip_bounds(ctx, b, lo, hi, lo_attr, hi_attr, s, scale)
    if isinstance(bounds, str):
        return bounds
    offset, high, _ = bounds
    if not (_near(offset, 3.0) and _near(high, 6.0)):
        return f"x * clip(x + {offset:g}, 0, {high:g}) / {high:g} is not HardSwish (x + 3, ceiling 6)"
    return True


@native_constraint("IsHardSwishSigmoid")
def is_hard_swish_sigmoid(ctx, alpha, beta):
    a = 0.2 if alpha is None else float(alpha)
    b = 0.5 if beta is None else float(beta)
    if not (_near(a, 1.0 / 6.0) and _near(b, 0.5)):
        return f"HardSigmoid(alpha = {a:g}, beta = {b:g}) is not HardSwish's (1/6, 0.5)"
    return True


@native_constraint("IsScalarOne")
def is_scalar_one(ctx, one):
    value = _float(ctx, one)
    return True if value == 1.0 else f"the constant is {value}, expected 1"
