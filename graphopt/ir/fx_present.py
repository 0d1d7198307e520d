"""How ATen nodes read in the canonical (ONNX) vocabulary the rules speak.

Each presenter in `_PRESENTERS` says, for one ATen op, which ONNX op it is and with
which inputs and attributes: ``aten.convolution`` is a Conv with
strides/pads/dilations/group, ``aten.addmm`` a Gemm, ``aten.matmul``/``mm``/``bmm``
a MatMul, ``aten.view``/``reshape`` a Reshape whose shape is a constant, and so on.
A presenter returns None for an argument form it cannot state in ONNX terms (a
promoting add, a symbolic bound); such a node, like one with no presenter, stays
opaque to the rules.

A Python number or int list in a node's arguments reads as a constant input
(`InlineConst`), made once per (node, argument) by `InlineConsts` so that the
matcher, which compares values by identity, sees the same object every time.

The view (graphopt.ir.fx_view) caches what `present` returns; the way back, from
canonical ops to ATen calls, is graphopt.ops.torch_lowering.
"""

from __future__ import annotations

import math
import operator
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from functools import cache
from typing import Any

import numpy as np
import torch
import torch.fx as fx

from graphopt.ir.dtypes import name_to_onnx_enum
from graphopt.ir.fx_values import InlineConst, is_neutral, meta_val, torch_dtype_name
from graphopt.pattern.ir import MISSING

__all__ = [
    "Presentation",
    "InlineConsts",
    "present",
    "arguments",
    "is_projection",
    "static_int",
    "tensor_args",
    "numpy_dtype",
]

aten = torch.ops.aten
prims = torch.ops.prims

_INT64_MAX = 9223372036854775807


@dataclass
class Presentation:
    """How one ATen node reads in the canonical vocabulary."""

    op_type: str
    inputs: list[Any]
    attrs: dict[str, Any] = field(default_factory=dict)
    domain: str = ""


# --------------------------------------------------------------------------- argument helpers


@cache
def _schema_args(target: Any) -> tuple[tuple[str, ...], tuple[Any, ...]]:
    """Argument names of an OpOverload and their defaults (MISSING where there is none)."""
    names, defaults = [], []
    for arg in target._schema.arguments:
        names.append(arg.name)
        defaults.append(arg.default_value if arg.has_default_value() else MISSING)
    return tuple(names), tuple(defaults)


def arguments(node: fx.Node) -> dict[str, Any]:
    names, defaults = _schema_args(node.target)
    found = dict(zip(names, defaults))
    found.update(zip(names, node.args))
    found.update(node.kwargs)
    return found


def _is_tuple_valued(node: fx.Node) -> bool:
    return isinstance(meta_val(node), (tuple, list))


def is_projection(node: fx.Node) -> bool:
    """A getitem that picks one output of a tuple-returning node (part of that node, not a node itself)."""
    return (
        node.op == "call_function"
        and node.target is operator.getitem
        and isinstance(node.args[0], fx.Node)
        and _is_tuple_valued(node.args[0])
    )


def static_int(value: Any) -> int | None:
    """A Python int for an int or a SymInt that is known to be constant."""
    if isinstance(value, bool):
        return int(value)
    if isinstance(value, int):
        return value
    if isinstance(value, torch.SymInt):
        expr = value.node.expr
        return int(expr) if expr.is_number else None
    return None


def tensor_args(node: fx.Node) -> list[fx.Node]:
    found: list[fx.Node] = []
    fx.node.map_arg((node.args, node.kwargs), lambda n: found.append(n) or n)  # type: ignore[func-returns-value]
    return found


# --------------------------------------------------------------------------- constants written inline


class InlineConsts:
    """The `InlineConst` of each (node, argument): one object per argument, so that the
    matcher, which compares values by identity, sees the same constant every time."""

    def __init__(self) -> None:
        self._consts: dict[tuple[fx.Node, str], InlineConst] = {}

    def scalar(self, node: fx.Node, key: str, value: Any, dtype: torch.dtype) -> InlineConst:
        """The constant standing for a Python number in `node`'s argument `key`."""
        np_dtype = np.dtype(numpy_dtype(dtype))
        return self._interned(node, key, np.asarray(value, dtype=np_dtype), value)

    def const_list(self, node: fx.Node, key: str, values: Sequence[Any]) -> Any:
        """An int64 vector constant for an int-list argument; a symbolic list stays a non-constant value."""
        ints = [static_int(x) for x in values]
        if None in ints:
            return self._interned(node, key, None, list(values))
        return self._interned(node, key, np.asarray(ints, dtype=np.int64), list(values))

    def _interned(self, node: fx.Node, key: str, array: np.ndarray | None, raw: Any) -> InlineConst:
        found = self._consts.get((node, key))
        if found is not None and _same_raw(found.raw, raw):
            return found
        const = InlineConst(array, f"{node.name}.{key}", raw)
        self._consts[(node, key)] = const
        return const


def numpy_dtype(dtype: torch.dtype) -> Any:
    if dtype == torch.bfloat16:
        import ml_dtypes

        return ml_dtypes.bfloat16
    return torch.empty((), dtype=dtype).numpy().dtype


def _same_raw(a: Any, b: Any) -> bool:
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return len(a) == len(b) and all(_same_raw(x, y) for x, y in zip(a, b))
    return type(a) is type(b) and (a is b or a == b or (isinstance(a, float) and math.isnan(a) and math.isnan(b)))


# --------------------------------------------------------------------------- presenters


Presenter = Callable[["InlineConsts", fx.Node, dict[str, Any]], "Presentation | None"]
_PRESENTERS: dict[Any, Presenter] = {}


def _presents(*targets: Any) -> Callable[[Presenter], Presenter]:
    def register(fn: Presenter) -> Presenter:
        for target in targets:
            _PRESENTERS[target] = fn
        return fn

    return register


def _rank(node: Any) -> int | None:
    val = meta_val(node)
    return val.dim() if isinstance(val, torch.Tensor) else None


@_presents(aten.convolution.default)
def _conv(c: InlineConsts, node: fx.Node, a: dict[str, Any]) -> Presentation | None:
    weight = meta_val(a["weight"])
    if weight is None or not all(isinstance(p, int) for p in [*a["padding"], *a["stride"], *a["dilation"]]):
        return None
    spatial = weight.dim() - 2
    kernel = [static_int(d) for d in weight.shape[2:]]
    if spatial < 1 or None in kernel:
        return None
    pads = [int(p) for p in a["padding"]] * 2  # ONNX: begins, then ends
    attrs: dict[str, Any] = {
        "auto_pad": "NOTSET",
        "dilations": [int(d) for d in a["dilation"]],
        "group": int(a["groups"]),
        "kernel_shape": kernel,
        "pads": pads,
        "strides": [int(s) for s in a["stride"]],
    }
    if a["transposed"]:
        attrs["output_padding"] = [int(p) for p in a["output_padding"]]
        return Presentation("ConvTranspose", [a["input"], a["weight"], a["bias"]], attrs)
    if any(int(p) for p in a["output_padding"]):
        return None
    return Presentation("Conv", [a["input"], a["weight"], a["bias"]], attrs)


@_presents(aten.addmm.default)
def _addmm(c: InlineConsts, node: fx.Node, a: dict[str, Any]) -> Presentation | None:
    attrs = {"alpha": float(a["alpha"]), "beta": float(a["beta"]), "transA": 0, "transB": 0}
    return Presentation("Gemm", [a["mat1"], a["mat2"], a["self"]], attrs)


@_presents(aten.mm.default, aten.bmm.default, aten.matmul.default)
def _matmul(c: InlineConsts, node: fx.Node, a: dict[str, Any]) -> Presentation | None:
    return Presentation("MatMul", [a["self"], a["mat2"] if "mat2" in a else a["other"]])


@_presents(aten.t.default, aten.permute.default, aten.transpose.int)
def _transpose(c: InlineConsts, node: fx.Node, a: dict[str, Any]) -> Presentation | None:
    rank = _rank(a["self"])
    if rank is None:
        return None
    if node.target is aten.permute.default:
        perm = [int(d) % rank for d in a["dims"]]
    elif node.target is aten.transpose.int:
        perm = list(range(rank))
        d0, d1 = int(a["dim0"]) % rank, int(a["dim1"]) % rank
        perm[d0], perm[d1] = perm[d1], perm[d0]
    else:
        perm = list(range(rank))[::-1]
    return Presentation("Transpose", [a["self"]], {"perm": perm})


@_presents(aten.view.default, aten.reshape.default, aten._unsafe_view.default)
def _reshape(c: InlineConsts, node: fx.Node, a: dict[str, Any]) -> Presentation | None:
    size = list(a["shape"] if node.target is aten.reshape.default else a["size"])
    shape = c.const_list(node, "size", size)
    # aten never copies a dim for a 0 (ONNX's allowzero = 0 does): a literal 0 needs allowzero.
    attrs = {"allowzero": 1} if any(static_int(s) == 0 for s in size) else {}
    return Presentation("Reshape", [a["self"], shape], attrs)


@_presents(aten.expand.default)
def _expand(c: InlineConsts, node: fx.Node, a: dict[str, Any]) -> Presentation | None:
    out = meta_val(node)
    if out is None:
        return None
    return Presentation("Expand", [a["self"], c.const_list(node, "size", list(out.shape))])


@_presents(aten._shape_as_tensor.default)
def _shape(c: InlineConsts, node: fx.Node, a: dict[str, Any]) -> Presentation | None:
    return Presentation("Shape", [a["self"]])


@_presents(aten.arange.default, aten.arange.start, aten.arange.start_step)
def _range(c: InlineConsts, node: fx.Node, a: dict[str, Any]) -> Presentation | None:
    out = meta_val(node)
    bounds = [a.get("start", 0), a["end"], a.get("step", 1)]
    if out is None or not all(isinstance(x, (int, float)) and not isinstance(x, bool) for x in bounds):
        return None  # symbolic bounds stay aten's
    return Presentation("Range", [c.scalar(node, key, x, out.dtype) for key, x in zip(("start", "end", "step"), bounds)])


@_presents(aten.unsqueeze.default)
def _unsqueeze(c: InlineConsts, node: fx.Node, a: dict[str, Any]) -> Presentation | None:
    return Presentation("Unsqueeze", [a["self"], c.const_list(node, "dim", [int(a["dim"])])])


@_presents(aten.squeeze.dim, aten.squeeze.dims)
def _squeeze(c: InlineConsts, node: fx.Node, a: dict[str, Any]) -> Presentation | None:
    src = meta_val(a["self"])
    dims = a["dim"] if isinstance(a["dim"], (list, tuple)) else [a["dim"]]
    if src is None or any(static_int(src.shape[int(d)]) != 1 for d in dims):
        return None  # aten keeps a dim that is not 1; ONNX Squeeze would fail
    return Presentation("Squeeze", [a["self"], c.const_list(node, "dim", [int(d) for d in dims])])


def _binary(op_type: str) -> Presenter:
    def present(c: InlineConsts, node: fx.Node, a: dict[str, Any]) -> Presentation | None:
        out = meta_val(node)
        if out is None or a.get("alpha", 1) != 1:
            return None
        # ONNX arithmetic needs one element type; aten promotes. Present only when nothing is promoted.
        inputs: list[Any] = []
        for key in ("self", "other"):
            x = a[key]
            if isinstance(x, fx.Node):
                if not isinstance(meta_val(x), torch.Tensor) or meta_val(x).dtype != out.dtype:
                    return None
                inputs.append(x)
            elif isinstance(x, (int, float, bool)):
                inputs.append(c.scalar(node, key, x, out.dtype))
            else:
                return None
        return Presentation(op_type, inputs)

    return present


for _op, _name in (("add", "Add"), ("sub", "Sub"), ("mul", "Mul"), ("div", "Div")):
    _PRESENTERS[getattr(aten, _op).Tensor] = _PRESENTERS[getattr(aten, _op).Scalar] = _binary(_name)
# aten.maximum / minimum of two tensors read as ONNX Max / Min (rules match them: flax's LayerNorm clamps its variance with Max).
_PRESENTERS[aten.maximum.default] = _binary("Max")
_PRESENTERS[aten.minimum.default] = _binary("Min")


@_presents(aten.rsub.Scalar)
def _rsub(c: InlineConsts, node: fx.Node, a: dict[str, Any]) -> Presentation | None:
    out = meta_val(node)
    if out is None or a.get("alpha", 1) != 1 or meta_val(a["self"]).dtype != out.dtype:
        return None
    return Presentation("Sub", [c.scalar(node, "other", a["other"], out.dtype), a["self"]])


@_presents(aten.where.self)
def _where(c: InlineConsts, node: fx.Node, a: dict[str, Any]) -> Presentation | None:
    out = meta_val(node)
    if out is None or any(meta_val(a[k]).dtype != out.dtype for k in ("self", "other")):
        return None
    return Presentation("Where", [a["condition"], a["self"], a["other"]])


@_presents(aten.masked_fill.Scalar, aten.masked_fill.Tensor)
def _masked_fill(c: InlineConsts, node: fx.Node, a: dict[str, Any]) -> Presentation | None:
    # masked_fill(x, mask, value) is Where(mask, value, x): the output has x's shape (mask broadcasts to it).
    out, mask, value = meta_val(node), meta_val(a["mask"]), a["value"]
    if out is None or mask is None or mask.dtype != torch.bool or meta_val(a["self"]).shape != out.shape:
        return None
    if isinstance(value, fx.Node):
        if not isinstance(meta_val(value), torch.Tensor) or meta_val(value).dtype != out.dtype:
            return None
        fill: Any = value
    else:
        fill = c.scalar(node, "value", value, out.dtype)
    return Presentation("Where", [a["mask"], fill, a["self"]])


@_presents(aten.pow.Tensor_Scalar)
def _pow(c: InlineConsts, node: fx.Node, a: dict[str, Any]) -> Presentation | None:
    out = meta_val(node)
    if out is None or meta_val(a["self"]).dtype != out.dtype:
        return None
    return Presentation("Pow", [a["self"], c.scalar(node, "exponent", a["exponent"], out.dtype)])


def _unary(op_type: str, **attrs: Any) -> Presenter:
    def present(c: InlineConsts, node: fx.Node, a: dict[str, Any]) -> Presentation | None:
        return Presentation(op_type, [a["self"]], dict(attrs))

    return present


for _target, _name in (
    (aten.relu.default, "Relu"),
    (aten.sigmoid.default, "Sigmoid"),
    (aten.tanh.default, "Tanh"),
    (aten.erf.default, "Erf"),
    (aten.sqrt.default, "Sqrt"),
    (aten.reciprocal.default, "Reciprocal"),
    (aten.exp.default, "Exp"),
    (aten.log.default, "Log"),
    (aten.neg.default, "Neg"),
    (aten.abs.default, "Abs"),
    (aten.isnan.default, "IsNaN"),
    (aten.sin.default, "Sin"),
    (aten.cos.default, "Cos"),
):
    _PRESENTERS[_target] = _unary(_name)
# SiLU is ONNX's Swish (opset 24) at alpha 1.
_PRESENTERS[aten.silu.default] = _unary("Swish", alpha=1.0)


@_presents(aten.gelu.default)
def _gelu(c: InlineConsts, node: fx.Node, a: dict[str, Any]) -> Presentation | None:
    return Presentation("Gelu", [a["self"]], {"approximate": str(a["approximate"])})


@_presents(aten.leaky_relu.default)
def _leaky_relu(c: InlineConsts, node: fx.Node, a: dict[str, Any]) -> Presentation | None:
    return Presentation("LeakyRelu", [a["self"]], {"alpha": float(a["negative_slope"])})


# aten.alias is a view of the whole tensor, without detach's gradient meaning: an Identity.
_PRESENTERS[aten.alias.default] = _unary("Identity")
# Hard and smooth activations (hard_activations.pdll fuses their written-out forms into these).
_PRESENTERS[aten.hardsigmoid.default] = _unary("HardSigmoid", alpha=1.0 / 6.0, beta=0.5)
_PRESENTERS[aten.hardswish.default] = _unary("HardSwish")
_PRESENTERS[aten.mish.default] = _unary("Mish")


@_presents(aten.softplus.default)
def _softplus(c: InlineConsts, node: fx.Node, a: dict[str, Any]) -> Presentation | None:
    # aten returns x itself above beta * x > threshold; from a threshold of 20 on, that differs
    # from log(1 + exp(x)) by less than exp(-20) relative: ONNX's Softplus at beta 1.
    if a["beta"] != 1 or a["threshold"] < 20:
        return None
    return Presentation("Softplus", [a["self"]])


@_presents(aten.hardtanh.default, aten.clamp.default)
def _clip(c: InlineConsts, node: fx.Node, a: dict[str, Any]) -> Presentation | None:
    lo, hi = (a["min_val"], a["max_val"]) if node.target is aten.hardtanh.default else (a["min"], a["max"])
    dtype = meta_val(node).dtype
    return Presentation("Clip", [a["self"], None if lo is None else c.scalar(node, "min", lo, dtype),
                                 None if hi is None else c.scalar(node, "max", hi, dtype)])


@_presents(aten._softmax.default)
def _softmax(c: InlineConsts, node: fx.Node, a: dict[str, Any]) -> Presentation | None:
    if a["half_to_float"]:
        return None
    return Presentation("Softmax", [a["self"]], {"axis": int(a["dim"])})


@_presents(aten.mean.dim)
def _reduce_mean(c: InlineConsts, node: fx.Node, a: dict[str, Any]) -> Presentation | None:
    if a["dim"] is None or a.get("dtype") is not None:
        return None
    axes = c.const_list(node, "dim", [int(d) for d in a["dim"]])
    return Presentation("ReduceMean", [a["self"], axes], {"keepdims": int(bool(a["keepdim"]))})


# sum(x, dims) / N is how some code writes a mean: normalization.pdll's families read ReduceSum * (1/N).
@_presents(aten.sum.dim_IntList)
def _reduce_sum(c: InlineConsts, node: fx.Node, a: dict[str, Any]) -> Presentation | None:
    if a["dim"] is None or a.get("dtype") is not None:
        return None
    axes = c.const_list(node, "dim", [int(d) for d in a["dim"]])
    return Presentation("ReduceSum", [a["self"], axes], {"keepdims": int(bool(a["keepdim"]))})


@_presents(aten.native_layer_norm.default)
def _layer_norm(c: InlineConsts, node: fx.Node, a: dict[str, Any]) -> Presentation | None:
    axis = -len(a["normalized_shape"])
    attrs = {"axis": axis, "epsilon": float(a["eps"]), "stash_type": 1}
    return Presentation("LayerNormalization", [a["input"], a["weight"], a["bias"]], attrs)


@_presents(aten.rms_norm.default)
def _rms_norm(c: InlineConsts, node: fx.Node, a: dict[str, Any]) -> Presentation | None:
    if a["weight"] is None or a["eps"] is None:  # no scale, or torch's dtype-dependent default epsilon
        return None
    attrs = {"axis": -len(a["normalized_shape"]), "epsilon": float(a["eps"]), "stash_type": 1}
    return Presentation("RMSNormalization", [a["input"], a["weight"]], attrs)


@_presents(aten.native_group_norm.default)
def _group_norm(c: InlineConsts, node: fx.Node, a: dict[str, Any]) -> Presentation | None:
    # ONNX GroupNormalization (opset 21: per-channel scale and bias) has one output: the
    # group statistics torch also returns must be unread.
    if a["weight"] is None or a["bias"] is None or any(u.target is operator.getitem and u.args[1] != 0 and u.users for u in node.users):
        return None
    attrs = {"num_groups": int(a["group"]), "epsilon": float(a["eps"]), "stash_type": 1}
    return Presentation("GroupNormalization", [a["input"], a["weight"], a["bias"]], attrs)


@_presents(aten._native_batch_norm_legit_no_training.default, aten.native_batch_norm.default)
def _batch_norm(c: InlineConsts, node: fx.Node, a: dict[str, Any]) -> Presentation | None:
    if a.get("training", False):
        return None
    attrs = {"epsilon": float(a["eps"]), "momentum": float(a["momentum"]), "training_mode": 0}
    return Presentation("BatchNormalization", [a["input"], a["weight"], a["bias"], a["running_mean"], a["running_var"]], attrs)


@_presents(aten._to_copy.default, prims.convert_element_type.default)
def _cast(c: InlineConsts, node: fx.Node, a: dict[str, Any]) -> Presentation | None:
    src, out = meta_val(a["a"] if "a" in a else a["self"]), meta_val(node)
    if src is None or out is None or out.device != src.device:
        return None
    if node.target is aten._to_copy.default and a.get("memory_format") not in (None, torch.preserve_format):
        return None
    name = torch_dtype_name(out.dtype)
    try:
        to = name_to_onnx_enum(name or "")
    except KeyError:
        return None
    return Presentation("Cast", [a["a"] if "a" in a else a["self"]], {"to": to})


@_presents(aten.cat.default)
def _concat(c: InlineConsts, node: fx.Node, a: dict[str, Any]) -> Presentation | None:
    return Presentation("Concat", list(a["tensors"]), {"axis": int(a["dim"])})


@_presents(aten.slice.Tensor)
def _slice(c: InlineConsts, node: fx.Node, a: dict[str, Any]) -> Presentation | None:
    start = 0 if a["start"] is None else static_int(a["start"])
    end = _INT64_MAX if a["end"] is None else static_int(a["end"])
    if start is None or end is None:
        return None
    return Presentation("Slice", [
        a["self"],
        c.const_list(node, "start", [start]),
        c.const_list(node, "end", [end]),
        c.const_list(node, "dim", [int(a["dim"])]),
        c.const_list(node, "step", [int(a["step"])]),
    ])


@_presents(aten.split.Tensor, aten.split_with_sizes.default)
def _split(c: InlineConsts, node: fx.Node, a: dict[str, Any]) -> Presentation | None:
    outs = meta_val(node)
    if not isinstance(outs, (list, tuple)):
        return None
    axis = int(a["dim"])
    sizes = [static_int(o.shape[axis]) for o in outs]
    if None in sizes:
        return None
    return Presentation("Split", [a["self"], c.const_list(node, "split_size", sizes)], {"axis": axis, "num_outputs": len(outs)})


@_presents(aten.constant_pad_nd.default)
def _pad(c: InlineConsts, node: fx.Node, a: dict[str, Any]) -> Presentation | None:
    rank = _rank(a["self"])
    static = [static_int(p) for p in a["pad"]]
    pad = [p for p in static if p is not None]
    if rank is None or len(pad) != len(static) or len(pad) % 2 or len(pad) > 2 * rank:
        return None
    # torch lists (begin, end) pairs from the last axis backwards; ONNX all begins, then all ends.
    begins, ends = [0] * rank, [0] * rank
    for k in range(len(pad) // 2):
        begins[rank - 1 - k], ends[rank - 1 - k] = pad[2 * k], pad[2 * k + 1]
    dtype = meta_val(node).dtype
    return Presentation("Pad", [a["self"], c.const_list(node, "pad", begins + ends), c.scalar(node, "value", a["value"], dtype)],
                        {"mode": "constant"})


@_presents(aten.scaled_dot_product_attention.default)
def _sdpa(c: InlineConsts, node: fx.Node, a: dict[str, Any]) -> Presentation | None:
    # ONNX Attention (opset 23) on 4-D q/k/v: the same semantics as SDPA (bool mask True =
    # attend, float mask added, scale default 1/sqrt(head size), grouped heads).
    if a["dropout_p"] != 0.0:
        return None
    attrs: dict[str, Any] = {"is_causal": int(bool(a["is_causal"]))}
    if a.get("scale") is not None:
        attrs["scale"] = float(a["scale"])
    return Presentation("Attention", [a["query"], a["key"], a["value"], a["attn_mask"]], attrs)



# --------------------------------------------------------------------------- presenting a node


def present(node: fx.Node, consts: InlineConsts) -> Presentation | None:
    """How `node` reads in the canonical vocabulary, or None (opaque to the rules)."""
    if node.op != "call_function" or is_neutral(node):
        return None
    presenter = _PRESENTERS.get(node.target)
    if presenter is None or not isinstance(meta_val(node), (torch.Tensor, tuple, list)):
        return None
    try:
        return presenter(consts, node, arguments(node))
    except (KeyError, TypeError, AttributeError, IndexError):  # an argument form the presenter does not know
        return None
