"""Native constraints several pattern files use (declared in each .pdll that calls them)."""

from __future__ import annotations

from graphopt.pattern.native import native_constraint


@native_constraint("DefaultOpsetAtLeast")
def default_opset_at_least(ctx, version):
    """The model imports the default ONNX domain at `version` or later (the standard op exists)."""
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


@native_constraint("IsPerFeature")
def is_per_feature(ctx, x, p):
    """p (optional) has shape [hidden] where hidden is x's static last dim, and x's dtype:
    a per-feature scale or bias."""
    if p is None:
        return True
    shape, pshape = ctx.shape(x), ctx.shape(p)
    if shape is None or not shape or not isinstance(shape[-1], int):
        return "the last dim of the input is not static"
    if pshape is None or tuple(pshape) != (shape[-1],):
        return f"the scale/bias has shape {None if pshape is None else list(pshape)}, expected [{shape[-1]}]"
    if ctx.dtype(p) != ctx.dtype(x):
        return f"the scale/bias is {ctx.dtype(p)}, the input {ctx.dtype(x)}"
    return True
