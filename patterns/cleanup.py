"""Native helpers for cleanup.pdll."""

from __future__ import annotations

from graphopt.pattern.native import RewriteDeclined, native_constraint, native_rewrite


@native_constraint("InMainGraph")
def in_main_graph(ctx, x):
    """The value lives in the model's main graph (where constants are initializers)."""
    return True if getattr(x, "graph", None) is ctx.view.model.graph else "the node is in a subgraph or a function"


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
