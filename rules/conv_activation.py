"""Native helpers for conv_activation.pdll: the `activation_params` of a graphopt.FusedConv,
as onnxruntime's FusedConv reads them (GetFusedActivationAttr): LeakyRelu [alpha],
HardSigmoid [alpha, beta], Clip [min, max]."""

from __future__ import annotations

import numpy as np

from graphopt.pattern.native import RewriteDeclined, native_constraint, native_rewrite

_FLOAT_MAX = float(np.finfo(np.float32).max)


def _scalar(ctx, value) -> float:
    bound = ctx.scalar(value)
    if bound is None:
        raise RewriteDeclined("Clip's min or max is not a one-element constant")
    return bound


def _clip_params(ctx, lo, hi, lo_attr, hi_attr) -> list[float]:
    """Clip's bounds: optional scalar inputs from opset 11, attributes before; a missing
    bound is the float range (ReLU6 from both exporters: Clip(x, 0, 6) with constant inputs)."""
    low = _scalar(ctx, lo) if lo is not None else (None if lo_attr is None else float(lo_attr))
    high = _scalar(ctx, hi) if hi is not None else (None if hi_attr is None else float(hi_attr))
    low = -_FLOAT_MAX if low is None else max(low, -_FLOAT_MAX)
    high = _FLOAT_MAX if high is None else min(high, _FLOAT_MAX)
    return [low, high]


@native_rewrite("ActivationParams")
def activation_params(ctx, kind, alpha, beta, lo, hi, lo_attr, hi_attr):
    """`activation_params` for the matched activation type (None: the attribute is left out)."""
    if kind == "LeakyRelu":
        return {"params": [0.01 if alpha is None else float(alpha)]}
    if kind == "HardSigmoid":
        return {"params": [0.2 if alpha is None else float(alpha), 0.5 if beta is None else float(beta)]}
    if kind == "Clip":
        return {"params": _clip_params(ctx, lo, hi, lo_attr, hi_attr)}
    return {"params": None}


@native_constraint("HasNoActivation")
def has_no_activation(ctx, activation):
    """A FusedConv that only adds Z (no activation yet) can take one more activation."""
    if activation is None or activation == "":
        return True
    return f"the FusedConv already applies {activation}"
