"""Native constraints several pattern files use (declared in each .pdll that calls them)."""

from __future__ import annotations

from graphopt.pattern.native import native_constraint


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
