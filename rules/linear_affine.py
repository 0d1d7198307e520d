"""Native helpers for linear_affine.pdll: a per-channel scale folded into constant weights."""

from __future__ import annotations

import numpy as np

from graphopt.pattern.native import RewriteDeclined, native_rewrite


def _scale_vector(ctx, s, weights: np.ndarray, channels: int, channel_axis: int, out_rank: int) -> np.ndarray:
    """The scale as one value per channel, or a decline: it must broadcast over the
    [.., C on channel_axis, ..] output as a per-channel value and have the weights' dtype."""
    scale = ctx.array(s)
    if scale is None or scale.dtype != weights.dtype or scale.dtype.kind != "f":
        raise RewriteDeclined("the scale is not a constant of the weights' float type")
    if scale.size == 1:
        return np.full(channels, scale.reshape(-1)[0], scale.dtype)
    if scale.ndim > out_rank:
        raise RewriteDeclined("the scale has more dims than the output")
    padded = (1,) * (out_rank - scale.ndim) + scale.shape
    axis = channel_axis % out_rank
    if padded[axis] != channels or any(d != 1 for i, d in enumerate(padded) if i != axis):
        raise RewriteDeclined(f"the scale's shape {list(scale.shape)} is not one value per channel ({channels})")
    return scale.reshape(-1)


@native_rewrite("ConvChannelScale")
def conv_channel_scale(ctx, w, b, s, group, kind):
    weights = ctx.array(w)
    if weights is None or weights.ndim < 3:
        raise RewriteDeclined("the weights are not a constant of rank >= 3")
    group = int(group or 1)
    # Conv weights [C_out, C_in/g, k...]; ConvTranspose [C_in, C_out/g, k...] (output channel grp * C_out/g + j)
    channels = weights.shape[0] if kind == "Conv" else weights.shape[1] * group
    scale = _scale_vector(ctx, s, weights, channels, 1, weights.ndim)
    if kind == "Conv":
        new_w = weights * scale.reshape((-1,) + (1,) * (weights.ndim - 1))
    else:
        grouped = weights.reshape((group, weights.shape[0] // group, weights.shape[1]) + weights.shape[2:])
        new_w = (grouped * scale.reshape((group, 1, weights.shape[1]) + (1,) * (weights.ndim - 2))).reshape(weights.shape)
    bias = None if b is None else ctx.array(b)
    if b is not None and (bias is None or bias.shape != (channels,)):
        raise RewriteDeclined("the bias is not a constant [C]")
    new_b = np.zeros(channels, weights.dtype) if bias is None else (bias * scale).astype(weights.dtype)
    return {"w": new_w.astype(weights.dtype), "b": new_b}


@native_rewrite("MatMulColumnScale")
def matmul_column_scale(ctx, w, s, y):
    weights = ctx.array(w)
    if weights is None or weights.ndim != 2:
        raise RewriteDeclined("the weights are not a constant [K, N]")
    rank = ctx.rank(y)
    if rank is None:
        raise RewriteDeclined("the product's rank is unknown")
    scale = _scale_vector(ctx, s, weights, weights.shape[1], -1, rank)
    return {"w": (weights * scale[None, :]).astype(weights.dtype)}
