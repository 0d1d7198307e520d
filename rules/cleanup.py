"""Native helpers for cleanup.pdll."""

from __future__ import annotations

import numpy as np

from graphopt.pattern.native import RewriteDeclined, native_constraint, native_rewrite


@native_constraint("InMainGraph")
def in_main_graph(ctx, x):
    """The value lives in the model's main graph (where constants are initializers)."""
    model = getattr(ctx.view, "model", None)   # an ONNX view; FX graphs have no Constant nodes to move
    if model is None or getattr(x, "graph", None) is not model.graph:
        return "the node is not in an ONNX model's main graph"
    return True


@native_constraint("IsInferenceDropout")
def is_inference_dropout(ctx, ratio, training):
    if training is None:
        return True
    value = ctx.array(training)
    if value is None or value.size != 1 or bool(value.reshape(-1)[0]):
        return "training_mode is not a constant false"
    return True


@native_rewrite("ConstantValue")
def constant_value(ctx, y):
    array = ctx.array(y)
    if array is None:
        raise RewriteDeclined("the Constant's value cannot be read")
    return {"value": array}


def _static(shape) -> bool:
    return shape is not None and all(isinstance(d, int) for d in shape)


@native_constraint("ResizeKeepsShape")
def resize_keeps_shape(ctx, x, y, scales, sizes):
    shape = ctx.shape(x)
    if not _static(shape):
        return "the input's shape is not static"
    if sizes is not None and ctx.array(sizes) is not None and ctx.array(sizes).size:
        return True if [int(v) for v in ctx.array(sizes)] == list(shape) else "the sizes differ from the input's dims"
    s = ctx.array(scales) if scales is not None else None
    if s is not None and s.size == len(shape) and np.all(s == 1.0):
        return True
    return "the Resize changes the shape (or its scales and sizes are not constants)"


@native_constraint("SameStaticDims")
def same_static_dims(ctx, x, y):
    sx, sy = ctx.shape(x), ctx.shape(y)
    if not (_static(sx) and _static(sy)):
        return "a shape is not static"
    if tuple(sx) != tuple(sy):
        return f"the shapes differ: {list(sx)} vs {list(sy)}"
    return True if ctx.dtype(x) == ctx.dtype(y) else "the dtypes differ"


@native_constraint("NotGraphOutput")
def not_graph_output(ctx, y):
    """Dropping a node whose output is a graph output would only put an Identity in its place."""
    return "its output is a graph output" if ctx.view.is_graph_output(y) else True


@native_constraint("AllZero")
def all_zero(ctx, pads):
    values = ctx.array(pads)
    if values is None:
        return "the pads are not constant"
    return True if not values.any() else f"pads {values.reshape(-1).tolist()} are not all 0"
