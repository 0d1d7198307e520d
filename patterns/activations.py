"""Native helpers for activations.pdll."""

from __future__ import annotations

import math

import numpy as np

from graphopt.pattern.native import native_constraint

_SQRT2 = math.sqrt(2.0)


def _scalar(ctx, c) -> float | None:
    array = None if c is None else ctx.array(c)
    if array is None or array.size != 1 or array.dtype.kind != "f":
        return None
    return float(array.reshape(-1)[0])


def _near(actual: float | None, expected: float) -> bool:
    return actual is not None and bool(np.isclose(actual, expected, rtol=1e-5, atol=0.0))


@native_constraint("GeluConstants")
def gelu_constants(ctx, scale, s, one, half, place, place2):
    """The constants are 1/sqrt(2) (as a divisor sqrt(2) or a factor), 1 and 0.5, and the
    0.5 factor sits in one place (both alternatives of the root picked the same form)."""
    if place != place2:
        return f"the 0.5 factor forms do not agree ({place} / {place2})"
    want = _SQRT2 if scale == "div" else 1.0 / _SQRT2
    got = _scalar(ctx, s)
    if not _near(got, want):
        return f"the Erf argument is scaled by {got}, expected {want:.8g} ({scale})"
    if not _near(_scalar(ctx, one), 1.0):
        return f"the Erf term adds {_scalar(ctx, one)}, expected 1"
    if not _near(_scalar(ctx, half), 0.5):
        return f"the outer factor is {_scalar(ctx, half)}, expected 0.5"
    return True


@native_constraint("DefaultOpsetAtLeast")
def default_opset_at_least(ctx, version):
    opset = ctx.opset("")
    if opset is None or opset < int(version):
        return f"the model's opset is {opset}; the standard op needs {int(version)}"
    return True


@native_constraint("DefaultOpsetBelow")
def default_opset_below(ctx, version):
    opset = ctx.opset("")
    if opset is not None and opset >= int(version):
        return f"the model's opset is {opset}; the standard op is used from {int(version)}"
    return True
