"""Native helpers for cast.pdll."""

from __future__ import annotations

from graphopt.ir.dtypes import is_lossless_widening, name_to_onnx_enum, onnx_enum_to_name
from graphopt.pattern.native import native_constraint, native_rewrite


@native_constraint("CastIsNoOp")
def cast_is_no_op(ctx, x, to):
    source = ctx.dtype(x)
    if source is None:
        return "the input's type is unknown"
    target = onnx_enum_to_name(to)
    return True if source == target else f"casts {source} to {target}"


@native_constraint("CastChainIsLossless")
def cast_chain_is_lossless(ctx, x, mid):
    source = ctx.dtype(x)
    if source is None:
        return "the input's type is unknown"
    middle = onnx_enum_to_name(mid)
    if middle is None or not is_lossless_widening(source, middle):
        return f"{source} -> {middle} does not keep every value"
    return True


@native_constraint("HasKnownDType")
def has_known_dtype(ctx, x):
    dtype = ctx.dtype(x)
    if dtype is None:
        return "its type is unknown"
    try:
        name_to_onnx_enum(dtype)
    except KeyError:
        return f"type {dtype} has no Cast equivalent here"
    return True


@native_rewrite("OnnxTypeOf")
def onnx_type_of(ctx, x):
    return {"to": name_to_onnx_enum(ctx.dtype(x))}
