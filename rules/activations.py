"""Native helpers for activations.pdll."""

from __future__ import annotations

import math

import numpy as np

from graphopt.pattern.native import native_constraint, native_rewrite

_SQRT2 = math.sqrt(2.0)


def _scalar(ctx, c) -> float | None:
    array = None if c is None else ctx.array(c)
    if array is None or array.size != 1 or array.dtype.kind != "f":
        return None
    return float(array.reshape(-1)[0])


def _near(actual: float | None, expected: float) -> bool:
    return actual is not None and bool(np.isclose(actual, expected, rtol=1e-5, atol=0.0))


def _is(ctx, c, expected: float) -> bool:
    """The scalar constant c is `expected`, to 1e-5, or exactly `expected` rounded to c's own
    type (a float16 model holds 0.044715 as 0.044708...; its computation meant 0.044715)."""
    if _near(_scalar(ctx, c), expected):
        return True
    array = None if c is None else ctx.array(c)
    return array is not None and array.size == 1 and array.dtype.kind == "f" and array.dtype.itemsize < 4 and \
        bool(array.reshape(-1)[0] == np.asarray(expected, dtype=array.dtype))


@native_constraint("GeluConstants")
def gelu_constants(ctx, scale, s, one, half, place, place2):
    """The constants are 1/sqrt(2) (as a divisor sqrt(2) or a factor), 1 and 0.5, and the
    0.5 factor sits in one place (both alternatives of the root picked the same form)."""
    if place != place2:
        return f"the 0.5 factor forms do not agree ({place} / {place2})"
    want = _SQRT2 if scale == "div" else 1.0 / _SQRT2
    got = _scalar(ctx, s)
    if not _is(ctx, s, want):
        return f"the Erf argument is scaled by {got}, expected {want:.8g} ({scale})"
    if not _is(ctx, one, 1.0):
        return f"the Erf term adds {_scalar(ctx, one)}, expected 1"
    if not _is(ctx, half, 0.5):
        return f"the outer factor is {_scalar(ctx, half)}, expected 0.5"
    return True


_SQRT_2_OVER_PI = math.sqrt(2.0 / math.pi)


@native_constraint("GeluTanhConstants")
def gelu_tanh_constants(ctx, cube, three, k, s, one, half, place, place2):
    """x^3 is Pow(x, 3) or x * x * x (k * x * x * x: the scale first); the constants are 0.044715, sqrt(2/pi), 1 and 0.5,
    and the 0.5 factor sits in one place (both alternatives of the root picked the same form)."""
    if place != place2:
        return f"the 0.5 factor forms do not agree ({place} / {place2})"
    if cube == "pow" and not _is(ctx, three, 3.0):
        return f"the Pow exponent is {_scalar(ctx, three)}, expected 3"
    if not _is(ctx, k, 0.044715):
        return f"the cube is scaled by {_scalar(ctx, k)}, expected 0.044715"
    if not _is(ctx, s, _SQRT_2_OVER_PI):
        return f"the Tanh argument is scaled by {_scalar(ctx, s)}, expected {_SQRT_2_OVER_PI:.8g}"
    if not _is(ctx, one, 1.0):
        return f"the Tanh term adds {_scalar(ctx, one)}, expected 1"
    if not _is(ctx, half, 0.5):
        return f"the outer factor is {_scalar(ctx, half)}, expected 0.5"
    return True


@native_constraint("QuickGeluAlpha")
def quick_gelu_alpha(ctx, alpha):
    """The Sigmoid's argument is x scaled by 1.702."""
    if not _is(ctx, alpha, 1.702):
        return f"the Sigmoid argument is scaled by {_scalar(ctx, alpha)}, expected 1.702"
    value = ctx.array(alpha)
    if value.dtype == np.float64 and float(np.float32(1.702)) != float(value.reshape(-1)[0]):
        # The fused op's alpha is a float32 attribute: 1.702 would lose 1e-8, past float64's tolerance.
        return "alpha is a float64 1.702, which the fused op's float32 alpha attribute would round"
    return True


@native_rewrite("GeluForm")
def gelu_form(ctx, kind, approximate):
    """Which GELU the matched op computes, "none" (erf) or "tanh": graphopt.Gelu is the erf
    GELU and graphopt.FastGelu the tanh one by construction; the standard Gelu says which
    in `approximate` (absent: "none")."""
    if kind == "graphopt.Gelu":
        return {"form": "none"}
    if kind == "graphopt.FastGelu":
        return {"form": "tanh"}
    return {"form": approximate or "none"}
