"""Native helpers for group_norm.pdll: check the decomposed form's shapes and
constants, and give graphopt.GroupNorm / GroupNormalization their [C] scale and bias."""

from __future__ import annotations

import numpy as np

from graphopt.pattern.native import RewriteDeclined, native_constraint, native_rewrite


def _per_channel(ctx, p, rank: int, channels: int, what: str) -> np.ndarray:
    """p broadcasts against [N, C, ...] as one value per channel: its shape, aligned to the
    right with x's, is 1 everywhere but the channel axis (torch writes [C, 1, 1])."""
    array = ctx.array(p)
    if array is None:
        raise RewriteDeclined(f"{what} is not constant")
    if array.ndim > rank or array.ndim < rank - 1:
        raise RewriteDeclined(f"{what} has shape {list(array.shape)}, not one value per channel")
    padded = (1,) * (rank - array.ndim) + tuple(array.shape)
    if padded[1] != channels or any(d != 1 for i, d in enumerate(padded) if i != 1):
        raise RewriteDeclined(f"{what} has shape {list(array.shape)}, not one value per channel of {channels}")
    return array.reshape(channels)


@native_rewrite("GroupNormParams")
def group_norm_params(ctx, x, shape1, allowzero, shape2, shape_end, gamma, beta, dtype):
    shape = ctx.shape(x)
    if shape is None or len(shape) < 3:
        raise RewriteDeclined("the input's rank is unknown or below 3")
    channels = shape[1]
    if not isinstance(channels, int):
        raise RewriteDeclined("the channel count is not static")
    grouped = ctx.array(shape1)
    if grouped is None or grouped.shape != (3,):
        raise RewriteDeclined("the first Reshape does not make [N, G, -1]")
    n, groups, rest = (int(v) for v in grouped)
    batch_ok = (n == 0 and not allowzero) or (isinstance(shape[0], int) and n == shape[0])
    spatial = [d for d in shape[2:]]
    per_group = channels // groups if groups > 0 and channels % groups == 0 else None
    rest_ok = rest == -1 or (per_group is not None and all(isinstance(d, int) for d in spatial) and rest == per_group * int(np.prod(spatial)))
    if not batch_ok or per_group is None or not rest_ok:
        raise RewriteDeclined(f"the first Reshape makes {[n, groups, rest]}, not [N, G, C/G * spatial] with G dividing {channels}")
    if shape2 is not None:  # constant target shape: must be x's own (static) shape
        back = ctx.array(shape2)
        if back is None or not all(isinstance(d, int) for d in shape) or [int(v) for v in back.reshape(-1)] != list(shape):
            raise RewriteDeclined("the second Reshape does not restore the input's shape")
    elif shape_end is not None:
        raise RewriteDeclined("the second Reshape takes a slice of the input's shape")
    x_dtype = ctx.dtype(x)
    if ctx.dtype(gamma) != x_dtype or ctx.dtype(beta) != x_dtype:
        raise RewriteDeclined("gamma or beta has another dtype than the input")
    g = _per_channel(ctx, gamma, len(shape), channels, "gamma")
    b = _per_channel(ctx, beta, len(shape), channels, "beta")
    if dtype == "f32":  # com.microsoft.GroupNorm reads gamma and beta as float32 whatever the input is
        g, b = g.astype(np.float32), b.astype(np.float32)
    return {"groups": groups, "gamma": g, "beta": b}


@native_rewrite("FloatParams")
def float_params(ctx, x, scale, bias, groups):
    """GroupNormalization-21's scale and bias as float32 [C] (what com.microsoft.GroupNorm reads)."""
    shape = ctx.shape(x)
    s, b = ctx.array(scale), ctx.array(bias)
    if shape is None or len(shape) < 3 or not isinstance(shape[1], int):
        raise RewriteDeclined("the channel count is not static")
    channels = shape[1]
    if s is None or b is None or s.shape != (channels,) or b.shape != (channels,):
        raise RewriteDeclined(f"scale or bias is not [{channels}] (opset-21 GroupNormalization is per channel)")
    if groups is None or channels % int(groups):
        raise RewriteDeclined(f"{groups} groups do not divide {channels} channels")
    return {"gamma": s.astype(np.float32), "beta": b.astype(np.float32)}


def _axes(ctx, axes_attr, axes_input) -> list[int] | None:
    if axes_attr is not None:
        return [int(a) for a in np.asarray(axes_attr).reshape(-1)]
    array = ctx.array(axes_input) if axes_input is not None else None
    return None if array is None else [int(a) for a in array.reshape(-1)]


@native_constraint("NormalizesEachGroup")
def normalizes_each_group(ctx, form, one, zero, mean_axes, mean_axes_input, var_axes, var_axes_input, square, exponent):
    """The [N, G, -1] view is normalized per group: InstanceNormalization with scale 1 and
    bias 0 for each of the G groups, or the mean and variance taken over its last axis
    (the square as Mul(d, d) or Pow(d, 2))."""
    if form == "instance":  # (one value per group: InstanceNormalization's schema; GroupNormParams checks the groups)
        for p, value, what in ((one, 1.0, "InstanceNormalization scale"), (zero, 0.0, "InstanceNormalization bias")):
            array = ctx.array(p)
            if array is None or array.ndim != 1 or np.any(array != value):
                return f"the {what} is not {value:g} for each group"
        return True
    for what, axes in (("mean", _axes(ctx, mean_axes, mean_axes_input)), ("variance", _axes(ctx, var_axes, var_axes_input))):
        if axes not in ([-1], [2]):
            return f"the {what} is taken over axes {axes}, not the last axis of [N, G, -1]"
    if square == "pow":
        array = ctx.array(exponent)
        if array is None or array.size != 1 or float(array.reshape(-1)[0]) != 2.0:
            return "the square is a Pow whose exponent is not 2"
    return True


@native_rewrite("GroupEpsilon")
def group_epsilon(ctx, form, instance_eps, written_eps):
    """InstanceNormalization's epsilon attribute, or the constant added to the variance."""
    if form == "instance":
        return {"value": 1e-5 if instance_eps is None else float(instance_eps)}
    array = ctx.array(written_eps)
    if array is None or array.size != 1:
        raise RewriteDeclined("the epsilon added to the variance is not a one-element constant")
    return {"value": float(array.reshape(-1)[0])}
