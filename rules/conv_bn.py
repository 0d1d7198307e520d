"""Native helpers for conv_bn.pdll: fold BatchNormalization into weights and bias.

The per-channel scale and shift are computed in float64. Float32/float64 weights
are then multiplied in their own type (one rounding of the product, as onnxruntime
does; a float64 detour over millions of weights costs 3x the time for < 1 ulp);
float16/bfloat16 weights go through float64 so that folding adds only the final
rounding.
"""

from __future__ import annotations

import numpy as np

from graphopt.pattern.native import RewriteDeclined, native_rewrite


def _bn_scale_shift(ctx, g, beta, mean, var, eps, channels: int) -> tuple[np.ndarray, np.ndarray]:
    arrays = [ctx.array(v) for v in (g, beta, mean, var)]
    for name, a in zip(("scale", "B", "mean", "var"), arrays):
        if a is None or a.shape != (channels,):
            shape = None if a is None else list(a.shape)
            raise RewriteDeclined(f"BatchNormalization {name} has shape {shape}, expected [{channels}]")
    g_, beta_, mean_, var_ = (a.astype(np.float64) for a in arrays)
    scale = g_ / np.sqrt(var_ + float(1e-5 if eps is None else eps))
    return scale, beta_ - mean_ * scale


def _scaled(weights: np.ndarray, scale: np.ndarray) -> np.ndarray:
    """weights * scale (broadcast), in the weights' dtype."""
    if weights.dtype in (np.float32, np.float64):
        return weights * scale.astype(weights.dtype)
    return (weights.astype(np.float64) * scale).astype(weights.dtype)


def _weights(ctx, w) -> np.ndarray:
    array = ctx.array(w)
    if array is None:
        raise RewriteDeclined("weights are not constant")
    return array


@native_rewrite("FoldConvBN")
def fold_conv_bn_of(ctx, kind, w, b, g, beta, mean, var, eps, group):
    """Conv's weights are [C_out, ...]; ConvTranspose's [C_in, C_out / group, ...]."""
    if kind == "ConvTranspose":
        return fold_conv_transpose_bn(ctx, w, b, g, beta, mean, var, eps, group)
    return fold_conv_bn(ctx, w, b, g, beta, mean, var, eps)


def fold_conv_bn(ctx, w, b, g, beta, mean, var, eps):
    weights = _weights(ctx, w)
    out_channels = weights.shape[0]  # Conv weights are [C_out, C_in / group, k...] whatever the group
    scale, shift = _bn_scale_shift(ctx, g, beta, mean, var, eps, out_channels)
    bias = ctx.array(b) if b is not None else np.zeros(out_channels, weights.dtype)
    new_w = _scaled(weights, scale.reshape((-1,) + (1,) * (weights.ndim - 1)))
    new_b = bias.astype(np.float64) * scale + shift
    return {"w": new_w, "b": new_b.astype(weights.dtype)}


def fold_conv_transpose_bn(ctx, w, b, g, beta, mean, var, eps, group):
    weights = _weights(ctx, w)
    group = int(group or 1)
    # ConvTranspose weights are [C_in, C_out / group, k...]; output channel
    # c = grp * (C_out / group) + j is made from weights[grp's inputs, j].
    c_in, c_out_per_group = weights.shape[0], weights.shape[1]
    out_channels = c_out_per_group * group
    scale, shift = _bn_scale_shift(ctx, g, beta, mean, var, eps, out_channels)
    grouped = weights.reshape((group, c_in // group, c_out_per_group) + weights.shape[2:])
    grouped = _scaled(grouped, scale.reshape((group, 1, c_out_per_group) + (1,) * (weights.ndim - 2)))
    bias = ctx.array(b) if b is not None else np.zeros(out_channels, weights.dtype)
    new_b = bias.astype(np.float64) * scale + shift
    return {"w": grouped.reshape(weights.shape), "b": new_b.astype(weights.dtype)}


@native_rewrite("FoldGemmBN")
def fold_gemm_bn(ctx, bmat, c, g, beta, mean, var, eps, transB, alpha, cbeta):
    weights = _weights(ctx, bmat)
    if weights.ndim != 2:
        raise RewriteDeclined("Gemm B is not 2-D")
    out_axis = 0 if transB else 1  # B' = B^T when transB, and the output columns are B' columns
    out_features = weights.shape[out_axis]
    scale, shift = _bn_scale_shift(ctx, g, beta, mean, var, eps, out_features)
    alpha = 1.0 if alpha is None else float(alpha)
    cbeta = 1.0 if cbeta is None else float(cbeta)
    # BN(alpha * A B' + cbeta * C) = A (alpha * B' * s) + (cbeta * C * s + shift)
    new_w = _scaled(weights, alpha * (scale[:, None] if transB else scale[None, :]))
    bias = np.zeros(out_features) if c is None else ctx.array(c).astype(np.float64)
    if bias.ndim > 2:
        raise RewriteDeclined("Gemm C has more than 2 dims")
    new_b = cbeta * bias * scale + shift
    # The rewrite keeps the Gemm's other attributes (transA, transB) and sets beta = 1; alpha goes into B.
    return {"w": new_w, "b": new_b.astype(weights.dtype)}


@native_rewrite("FoldMatMulBN")
def fold_matmul_bn(ctx, bmat, g, beta, mean, var, eps):
    weights = _weights(ctx, bmat)
    scale, shift = _bn_scale_shift(ctx, g, beta, mean, var, eps, weights.shape[1])
    return {"w": _scaled(weights, scale[None, :]), "b": shift.astype(weights.dtype)}


@native_rewrite("BNScaleForWeights")
def bn_scale_for_weights(ctx, x, b, g, beta, mean, var, eps):
    """For weights that are computed in the graph (e.g. by ConstantOfShape), the
    scale stays a Mul on the weights; onnxruntime folds it when the session loads."""
    rank = ctx.rank(x)
    scale_array = ctx.array(g)
    dtype = ctx.dtype(x)
    if rank is None or scale_array is None or dtype not in ("f32", "f64", "f16", "bf16"):
        raise RewriteDeclined("the input's rank or dtype is unknown")
    channels = scale_array.shape[0] if scale_array.ndim == 1 else -1
    scale, shift = _bn_scale_shift(ctx, g, beta, mean, var, eps, channels)
    np_dtype = scale_array.dtype
    bias = ctx.array(b).astype(np.float64) if b is not None else np.zeros(channels)
    return {
        "scale": scale.reshape((-1,) + (1,) * (rank - 1)).astype(np_dtype),
        "b": (bias * scale + shift).astype(np_dtype),
    }
