"""Native helpers for bias_fold.pdll: a separate bias Add as the op's own bias input."""

from __future__ import annotations

import numpy as np

from graphopt.pattern.native import RewriteDeclined, native_rewrite


def _out_channels(ctx, w, kind: str, group) -> int:
    shape = ctx.shape(w)
    if shape is None or len(shape) < 3 or not all(isinstance(d, int) for d in shape[:2]):
        raise RewriteDeclined("the weights' channel dims are not static")
    # Conv weights are [C_out, C_in / group, k...]; ConvTranspose's [C_in, C_out / group, k...]
    return int(shape[0]) if kind == "Conv" else int(shape[1]) * int(group or 1)


def _new_bias(ctx, w, b, add_const: np.ndarray, channels: int) -> np.ndarray:
    dtype = ctx.dtype(w)
    if ctx.dtype(b if b is not None else w) != dtype or add_const.dtype.kind != "f" or str(add_const.dtype) != _np_name(dtype):
        raise RewriteDeclined("the bias, the weights and the added constant differ in type")
    old = np.zeros(channels, add_const.dtype) if b is None else ctx.array(b)
    if old is None or old.shape != (channels,):
        raise RewriteDeclined("the op's own bias is not a constant [C]")
    per_channel = np.broadcast_to(add_const.reshape(-1), (channels,)) if add_const.size in (1, channels) else None
    if per_channel is None:
        raise RewriteDeclined(f"the added constant has {add_const.size} values for {channels} channels")
    return (old.astype(np.float64) + per_channel.astype(np.float64)).astype(add_const.dtype)


def _np_name(dtype: str | None) -> str:
    return {"f32": "float32", "f16": "float16", "f64": "float64"}.get(dtype or "", "?")


@native_rewrite("ChannelBias")
def channel_bias(ctx, w, b, c, out, kind, group):
    """c broadcasts over the op's [N, C, spatial...] output as one value per channel C."""
    channels = _out_channels(ctx, w, kind, group)
    rank = len(ctx.shape(w))   # the output has the weights' rank
    const = ctx.array(c)
    if const is None:
        raise RewriteDeclined("the added value is not a constant")
    shape = const.shape
    if const.size != 1:
        # [C, 1, ..., 1] (rank - 1) or [1, C, 1, ..., 1] (rank): C on the channel axis, nothing else
        padded = (1,) * (rank - len(shape)) + tuple(shape)
        if len(shape) > rank or len(padded) != rank or padded[1] != channels or any(d != 1 for i, d in enumerate(padded) if i != 1):
            raise RewriteDeclined(f"the added constant's shape {list(shape)} is not per channel for a [N, {channels}, ...] output")
    return {"b": _new_bias(ctx, w, b, const, channels)}


@native_rewrite("ChannelsLastBias")
def channels_last_bias(ctx, w, b, c, perm, group):
    """Transpose moves the channel axis (1) last; c is [C] (or [1, .., 1, C]) on that last axis."""
    channels = _out_channels(ctx, w, "Conv", group)
    perm = list(perm or [])
    if not perm or perm[-1] != 1:
        raise RewriteDeclined(f"the Transpose {perm} does not put the channels last")
    const = ctx.array(c)
    if const is None:
        raise RewriteDeclined("the added value is not a constant")
    if const.size != 1 and (const.shape[-1] != channels or const.size != channels or const.ndim > len(perm)):
        raise RewriteDeclined(f"the added constant's shape {list(const.shape)} is not [{channels}] on the last axis")
    return {"b": _new_bias(ctx, w, b, const, channels)}
