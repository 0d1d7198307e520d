"""Native helpers for normalization.pdll."""

from __future__ import annotations

import numpy as np

from graphopt.ir.dtypes import onnx_enum_to_name
from graphopt.ir.symbolic import dims_equal
from graphopt.pattern.native import RewriteDeclined, native_constraint, native_rewrite


def _static_rank(ctx, x):
    return ctx.rank(x)


def reduces_last_axis(ctx, x, axes_attr, axes_input):
    """The ReduceMean reduces exactly the last axis of x (axes as attribute or as a constant input)."""
    if axes_attr is not None:
        axes = [int(a) for a in np.asarray(axes_attr).reshape(-1)]
    elif axes_input is not None:
        array = ctx.array(axes_input)
        if array is None:
            return "the axes are not constant"
        axes = [int(a) for a in array.reshape(-1)]
    else:
        return "the ReduceMean has no axes (it reduces every axis)"
    if axes == [-1]:
        return True
    rank = _static_rank(ctx, x)
    if rank is not None and axes == [rank - 1]:
        return True
    return f"the ReduceMean reduces axes {axes}, not only the last one (rank {rank})"


@native_constraint("IsSquare")
def is_square(ctx, form, exponent):
    """Mul(d, d) squares (no exponent bound); Pow(d, e) only when e is the constant 2."""
    if form == "mul" or (form != "pow" and exponent is None):
        return True
    array = ctx.array(exponent)
    if array is None or array.size != 1:
        return "the exponent is not a one-element constant"
    actual = float(array.reshape(-1)[0])
    if actual != 2.0:
        return f"the exponent is {actual}, not 2"
    return True


@native_constraint("SameStaticShape")
def same_static_shape(ctx, a, b):
    """a and b have the same known shape (static dims equal, symbolic dims the same name)."""
    recorded = ctx.same_recorded_shape(a, b)
    if recorded is False:
        return f"the shapes are not known to be equal: {ctx.shape_text(a)} vs {ctx.shape_text(b)}"
    if recorded is None:
        sa, sb = ctx.dims(a), ctx.dims(b)
        if sa is None or sb is None:
            return "a shape is unknown"
        if not dims_equal(sa, sb):
            return f"the shapes are not known to be equal: {list(sa)} vs {list(sb)}"
    if ctx.dtype(a) != ctx.dtype(b):
        return f"the dtypes differ: {ctx.dtype(a)} vs {ctx.dtype(b)}"
    return True


@native_constraint("IsLastAxis")
def is_last_axis(ctx, x, axis):
    rank = ctx.rank(x)
    axis = -1 if axis is None else int(axis)
    if axis == -1 or (rank is not None and axis == rank - 1):
        return True
    return f"normalizes axis {axis}, not the last one (rank {rank})"


@native_rewrite("ScalarOf")
def scalar_of(ctx, c):
    array = ctx.array(c)
    if array is None or array.size != 1:
        raise RewriteDeclined("not a one-element constant")
    value = float(array.reshape(-1)[0])
    if array.dtype == np.float64 and float(np.float32(value)) != value:
        # The fused ops' epsilon is a float32 attribute; rounding a float64 model's epsilon moves
        # its outputs by up to 1e-8 where the variance is small, past float64's tolerance.
        raise RewriteDeclined(f"epsilon {value:g} is float64, and the fused op's float32 epsilon attribute would round it")
    return {"value": value}


@native_constraint("IsAbsent")
def is_absent(ctx, x):
    """The optional input is not there (the op has no bias yet)."""
    return True if x is None else "the op already has this input"


# How far `NotComputedFrom` looks back before it stops trusting the answer.
_ANCESTOR_BUDGET = 512


@native_constraint("NotComputedFrom")
def not_computed_from(ctx, x, source):
    """`x` (e.g. a norm's scale) is not computed from `source` (the sum the fused op returns):
    the fused op would then read its own output. Constants and graph inputs pass at once."""
    if x is None or ctx.array(x) is not None:
        return True
    view = ctx.view
    stack, seen = [x], set()
    while stack:
        value = stack.pop()
        if value is source:
            return f"{getattr(x, 'name', 'the value')} is computed from the sum the fused op would replace"
        if id(value) in seen:
            continue
        seen.add(id(value))
        if len(seen) > _ANCESTOR_BUDGET:
            return f"cannot prove {getattr(x, 'name', 'the value')} independent of the sum (more than {_ANCESTOR_BUDGET} ancestors)"
        node = view.producer(value)
        if node is not None:
            stack.extend(v for v in view.inputs(node) if v is not None)
    return True


@native_constraint("IsUpcastAndBack")
def is_upcast_and_back(ctx, h, up, down):
    """h is half precision, cast up to float32 and the result cast back to h's type."""
    source = ctx.dtype(h)
    if source not in ("f16", "bf16"):
        return f"the input is {source or 'of unknown type'}, not f16/bf16"
    if onnx_enum_to_name(up) != "f32":
        return f"the upcast is to {onnx_enum_to_name(up)}, not f32"
    if onnx_enum_to_name(down) != source:
        return f"the result is cast to {onnx_enum_to_name(down)}, not back to {source}"
    return True




def _axes(ctx, attr, inp):
    if attr is not None:
        return [int(a) for a in np.asarray(attr).reshape(-1)]
    if inp is not None:
        array = ctx.array(inp)
        return None if array is None else [int(a) for a in array.reshape(-1)]
    return None


@native_constraint("IsMeanOverLastAxis")
def is_mean_over_last_axis(ctx, x, form, axes_attr, axes_input, sum_axes_attr, sum_axes_input, kind, factor):
    """A mean of x over its last axis: ReduceMean over it; ReduceSum over it times 1/N or
    divided by N (N the static last dim); GlobalAveragePool of a rank-3 x (it averages
    every axis after the second)."""
    if form == "reduce":
        return reduces_last_axis(ctx, x, axes_attr, axes_input)
    rank = ctx.rank(x)
    if form == "pool":
        return True if rank == 3 else f"GlobalAveragePool of a rank-{rank} tensor averages more than the last axis"
    if form != "sum":
        return f"not a mean ({form})"
    axes = _axes(ctx, sum_axes_attr, sum_axes_input)
    if axes is None:
        return "the ReduceSum's axes are not constant or not given"
    if not (axes == [-1] or (rank is not None and axes == [rank - 1])):
        return f"the ReduceSum reduces axes {axes}, not only the last one (rank {rank})"
    n, k = ctx.last_dim(x), ctx.scalar(factor)
    if not isinstance(n, int) or k is None:
        return "the last dim is not static or the factor is not a constant"
    want = 1.0 / n if kind == "Mul" else float(n)
    if not np.isclose(k, want, rtol=1e-6, atol=0.0):
        return f"the sum is {'multiplied' if kind == 'Mul' else 'divided'} by {k:g}, not by {want:g}: not a mean over {n}"
    return True


@native_constraint("IsClampAtZero")
def is_clamp_at_zero(ctx, zero, high):
    """The variance's clamp, where there is one: at the constant 0 (Max, Clip's min), no upper bound."""
    if high is not None:
        return "the Clip has an upper bound"
    if zero is None:
        return True
    value = ctx.array(zero)
    if value is None:
        return "the clamp is not a constant"
    return True if np.all(value == 0) else f"clamps at {float(value.ravel()[0]):g}, not 0"


@native_constraint("IsInverseSqrt")
def is_inverse_sqrt(ctx, form, c):
    """Div(1, sqrt(v)) needs the dividend 1; Pow(v, e) the exponent -0.5."""
    want = {"div1": 1.0, "pow": -0.5}.get(form)
    if want is None:
        return True
    actual = ctx.scalar(c)
    if actual != want:
        return f"the {'dividend' if form == 'div1' else 'exponent'} is {actual}, not {want:g}"
    return True


@native_constraint("VarianceFormAgrees")
def variance_form_agrees(ctx, square_form, variance_kind):
    """The central variance squares x - mean; the second moment squares x and subtracts mean^2."""
    if str(square_form).split("_")[0] != variance_kind:
        return f"a {variance_kind} variance cannot square {'x - mean' if variance_kind == 'second' else 'x'}"
    return True


@native_constraint("ShiftFormMatchesRoot")
def shift_form_matches_root(ctx, form, root):
    """x * a - mean * a is a Sub; every other shift is added."""
    if (form == "plain") != (root == "Sub"):
        return f"{root} of x * a and the shift written as {form}"
    return True


@native_constraint("WeightFormAgrees")
def weight_form_agrees(ctx, left, right):
    """RMSNorm: (x * inv) * weight, or x * (inv * weight); not x * weight alone, nor both."""
    if (left == "norm") != (right == "weight"):
        return "not an RMSNorm's weight (x times a tensor)" if left == "input" else "the weight is applied twice"
    return True


def _feature_vector(ctx, x, p, fill: float, what: str):
    """p as a [H] vector: itself when already [H], a reshaped copy of a [1, ..., 1, H] constant,
    or `fill` repeated H times when absent."""
    h = ctx.last_dim(x)
    if not isinstance(h, int):
        raise RewriteDeclined("the last dim of the input is not static")
    if p is None:
        dtype = {"f32": np.float32, "f16": np.float16, "f64": np.float64}.get(ctx.dtype(x) or "")
        if dtype is None:
            raise RewriteDeclined(f"no {what} constant of type {ctx.dtype(x)}")
        return ctx.constant(np.full((h,), fill, dtype), f"layer_norm_{what}")
    if ctx.dtype(p) != ctx.dtype(x):
        raise RewriteDeclined(f"the {what} is {ctx.dtype(p)}, the input {ctx.dtype(x)}")
    shape = ctx.shape(p)
    if shape is not None and tuple(shape) == (h,):
        return p
    array = ctx.array(p)
    if array is None or array.size != h or any(d != 1 for d in array.shape[:-1]) or array.shape[-1:] != (h,):
        raise RewriteDeclined(f"the {what} has shape {None if shape is None else list(shape)}, not [1, ..., 1, {h}]")
    return ctx.constant(array.reshape(h), f"layer_norm_{what}")


@native_rewrite("FeatureVectors")
def feature_vectors(ctx, x, gamma, beta):
    """LayerNormalization's scale and bias from a per-feature gamma and beta ([H] or [1, 1, H]); ones / zeros where absent."""
    return {"scale": _feature_vector(ctx, x, gamma, 1.0, "scale"), "bias": _feature_vector(ctx, x, beta, 0.0, "bias")}


@native_constraint("DenominatorFormMatchesRoot")
def denominator_form_matches_root(ctx, form, root):
    """(x - mean) is divided by the Sqrt, multiplied by any inverse of it."""
    if (form == "div") != (root == "Div"):
        return f"a {root} by the {'standard deviation' if form == 'div' else 'inverse standard deviation'}"
    return True


@native_constraint("IsAllOnes")
def is_all_ones(ctx, c):
    """A scale of ones, or none (torch's layer_norm without a weight, on FX)."""
    if c is None:
        return True
    value = ctx.array(c)
    if value is None:
        return "the scale is not a constant"
    return True if value.size and np.all(value == 1) else "the scale is not all ones"


@native_rewrite("Ones")
def ones(ctx, x):
    """A scale of ones for LayerNormalization: [H], x's type."""
    return {"value": _feature_vector(ctx, x, None, 1.0, "scale")}


@native_constraint("IsAbsentOrZero")
def is_absent_or_zero(ctx, c):
    """No bias, or a constant bias of zeros (the exporters write LayerNorm's missing bias so)."""
    if c is None:
        return True
    value = ctx.array(c)
    return True if value is not None and np.all(value == 0) else "the LayerNormalization has a bias"


_MEAN_OPS = ("ReduceMean", "GlobalAveragePool")


@native_constraint("IsNotCentered")
def is_not_centered(ctx, x):
    """x is not x0 - mean(x0): the RMS of a centered tensor is a LayerNorm's tail. Fused as
    RMSNorm it would keep onnxruntime from fusing the whole LayerNorm below opset 17 (four
    kernels instead of one), and above it FuseLayerNorm takes the whole."""
    view = ctx.view
    sub = view.producer(x)
    if sub is None or view.op_key(sub)[1] != "Sub":
        return True
    x0, mean = (list(view.inputs(sub)) + [None, None])[:2]
    node = view.producer(mean) if mean is not None else None
    if node is not None and view.op_key(node)[1] in ("Mul", "Div"):  # ReduceSum(x0) * (1/N) or / N
        inner = [view.producer(v) for v in view.inputs(node) if v is not None]
        node = next((n for n in inner if n is not None and view.op_key(n)[1] == "ReduceSum"), None)
    elif node is not None and view.op_key(node)[1] not in _MEAN_OPS:
        node = None
    if node is not None and view.inputs(node)[0] is x0:
        return "the input is x - mean(x): a LayerNorm, not an RMSNorm"
    return True
