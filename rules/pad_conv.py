"""Native helpers for pad_conv.pdll."""

from __future__ import annotations

import numpy as np

from graphopt.pattern.native import RewriteDeclined, native_rewrite


@native_rewrite("MergePadIntoConv")
def merge_pad_into_conv(ctx, form, pads, value, axes, pads_attr, value_attr, conv_pads, auto_pad, x):
    mode = auto_pad.decode() if isinstance(auto_pad, bytes) else auto_pad
    if mode not in ("NOTSET", "VALID"):  # SAME_*: the Conv pads by its own rule, from the input's size
        raise RewriteDeclined(f"the Conv pads by auto_pad = {mode}")
    rank = ctx.rank(x)
    if rank is None:
        raise RewriteDeclined("the Pad input's rank is unknown")
    if form == "input":
        pad_values = ctx.array(pads)
        fill = ctx.array(value) if value is not None else None
    else:
        pad_values = np.asarray(pads_attr if pads_attr is not None else [], dtype=np.int64)
        fill = np.asarray(value_attr if value_attr is not None else 0.0)
    if fill is not None and fill.size and np.any(fill != 0):
        raise RewriteDeclined("the Pad fills with a non-zero value")
    pad_values = np.asarray(pad_values, dtype=np.int64).reshape(-1)
    if axes is not None:  # opset 18+: pads only for the listed axes
        axis_list = [int(a) % rank for a in ctx.array(axes).reshape(-1)]
        full = np.zeros(2 * rank, np.int64)
        for i, axis in enumerate(axis_list):
            full[axis], full[axis + rank] = pad_values[i], pad_values[i + len(axis_list)]
        pad_values = full
    if pad_values.size != 2 * rank:
        raise RewriteDeclined(f"Pad has {pad_values.size} pads for rank {rank}")
    begins, ends = pad_values[:rank], pad_values[rank:]
    if np.any(pad_values < 0):
        raise RewriteDeclined("Pad crops (negative pads)")
    if begins[0] or begins[1] or ends[0] or ends[1]:
        raise RewriteDeclined("Pad pads the batch or channel axis")
    spatial = rank - 2
    existing = np.asarray(conv_pads if conv_pads is not None else [0] * (2 * spatial), dtype=np.int64)
    merged = existing + np.concatenate([begins[2:], ends[2:]])
    return {"pads": [int(p) for p in merged]}
