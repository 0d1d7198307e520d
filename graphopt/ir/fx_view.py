"""The graph view over a torch.fx graph of ATen ops (what `torch.compile` hands graphopt).

The rules speak ONNX's vocabulary, so this view *presents* each ATen node under
the ONNX op whose meaning it has: ``aten.convolution`` is a Conv with
strides/pads/dilations/group, ``aten.addmm`` a Gemm, ``aten.matmul``/``mm``/``bmm``
a MatMul, ``aten.view``/``reshape`` a Reshape whose shape is a constant, a Python
scalar argument a constant input, and so on (`_PRESENTERS` below). A node with no
presentation is *opaque*: its op key is ``("torch", "<aten op>")``, which no pattern
names, so rules never match it and it stays exactly as it is.

Values are the FX nodes themselves; an output of a node that returns a tuple
(``native_layer_norm``, ``split``, ...) is its ``operator.getitem`` node, or a
stand-in (`_Phantom`) while nobody reads it; a Python number or int list in an
argument is a `InlineConst`. Constants (frozen parameters, folded results) are
``get_attr`` nodes whose tensor `const_array` returns.

Mutation builds FX nodes at once: `new_node` lowers canonical ops back to ATen
calls (`graphopt.ops.torch_lowering`) and makes graphopt's own ops *neutral* nodes
(one call per op, lowered to ``torch.ops.graphopt.*`` after the rules ran, so that
later rules can still match them). New nodes wait at the end of the graph until
`commit` moves them before the rewritten root; `discard_pending` erases them.
"""

from __future__ import annotations

import itertools
import math
import operator
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from functools import cache, lru_cache
from typing import Any

import numpy as np
import onnx
import torch
import torch.fx as fx

from graphopt.ir.dtypes import name_to_onnx_enum
from graphopt.ir.fx_values import (
    InlineConst,
    NeutralOp,
    is_neutral,
    meta_val,
    neutral_op,
    numpy_to_tensor,
    tensor_to_numpy,
    torch_dtype_from_name,
    torch_dtype_name,
)
from graphopt.ops import torch_lowering
from graphopt.pattern.ir import MISSING
from graphopt.pattern.native import RewriteDeclined

__all__ = [
    "FxView",
    "InlineConst",
    "meta_val",
    "FX_OPSET",
    "NeutralOp",
    "neutral_op",
    "is_neutral",
    "torch_dtype_name",
    "torch_dtype_from_name",
    "tensor_to_numpy",
    "numpy_to_tensor",
]

aten = torch.ops.aten
prims = torch.ops.prims

#: The ONNX opset whose op meanings the view presents (Gelu 20, Attention 23, Swish 24 ...).
FX_OPSET = 24

_INT64_MAX = 9223372036854775807


class _Phantom:
    """Output `index` of a tuple-returning node that nobody reads (no getitem node yet)."""

    __slots__ = ("node", "index", "name")

    def __init__(self, node: fx.Node, index: int) -> None:
        self.node, self.index = node, index
        self.name = f"{node.name}[{index}]"


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


def _arguments(node: fx.Node) -> dict[str, Any]:
    names, defaults = _schema_args(node.target)
    found = dict(zip(names, defaults))
    found.update(zip(names, node.args))
    found.update(node.kwargs)
    return found


def _is_tuple_valued(node: fx.Node) -> bool:
    return isinstance(meta_val(node), (tuple, list))


def _is_projection(node: fx.Node) -> bool:
    """A getitem that picks one output of a tuple-returning node (part of that node, not a node itself)."""
    return (
        node.op == "call_function"
        and node.target is operator.getitem
        and isinstance(node.args[0], fx.Node)
        and _is_tuple_valued(node.args[0])
    )


def _static(value: Any) -> int | None:
    """A Python int for an int or a SymInt that is known to be constant."""
    if isinstance(value, bool):
        return int(value)
    if isinstance(value, int):
        return value
    if isinstance(value, torch.SymInt):
        expr = value.node.expr
        return int(expr) if expr.is_number else None
    return None


def _tensor_args(node: fx.Node) -> list[fx.Node]:
    found: list[fx.Node] = []
    fx.node.map_arg((node.args, node.kwargs), lambda n: found.append(n) or n)  # type: ignore[func-returns-value]
    return found


# --------------------------------------------------------------------------- presenters


Presenter = Callable[["FxView", fx.Node, dict[str, Any]], "Presentation | None"]
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
def _conv(v: FxView, node: fx.Node, a: dict[str, Any]) -> Presentation | None:
    weight = meta_val(a["weight"])
    if weight is None or not all(isinstance(p, int) for p in [*a["padding"], *a["stride"], *a["dilation"]]):
        return None
    spatial = weight.dim() - 2
    kernel = [_static(d) for d in weight.shape[2:]]
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
def _addmm(v: FxView, node: fx.Node, a: dict[str, Any]) -> Presentation | None:
    attrs = {"alpha": float(a["alpha"]), "beta": float(a["beta"]), "transA": 0, "transB": 0}
    return Presentation("Gemm", [a["mat1"], a["mat2"], a["self"]], attrs)


@_presents(aten.mm.default, aten.bmm.default, aten.matmul.default)
def _matmul(v: FxView, node: fx.Node, a: dict[str, Any]) -> Presentation | None:
    return Presentation("MatMul", [a["self"], a["mat2"] if "mat2" in a else a["other"]])


@_presents(aten.t.default, aten.permute.default, aten.transpose.int)
def _transpose(v: FxView, node: fx.Node, a: dict[str, Any]) -> Presentation | None:
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
def _reshape(v: FxView, node: fx.Node, a: dict[str, Any]) -> Presentation | None:
    size = list(a["shape"] if node.target is aten.reshape.default else a["size"])
    shape = v.const_list(node, "size", size)
    # aten never copies a dim for a 0 (ONNX's allowzero = 0 does): a literal 0 needs allowzero.
    attrs = {"allowzero": 1} if any(_static(s) == 0 for s in size) else {}
    return Presentation("Reshape", [a["self"], shape], attrs)


@_presents(aten.expand.default)
def _expand(v: FxView, node: fx.Node, a: dict[str, Any]) -> Presentation | None:
    out = meta_val(node)
    if out is None:
        return None
    return Presentation("Expand", [a["self"], v.const_list(node, "size", list(out.shape))])


@_presents(aten._shape_as_tensor.default)
def _shape(v: FxView, node: fx.Node, a: dict[str, Any]) -> Presentation | None:
    return Presentation("Shape", [a["self"]])


@_presents(aten.arange.default, aten.arange.start, aten.arange.start_step)
def _range(v: FxView, node: fx.Node, a: dict[str, Any]) -> Presentation | None:
    out = meta_val(node)
    bounds = [a.get("start", 0), a["end"], a.get("step", 1)]
    if out is None or not all(isinstance(x, (int, float)) and not isinstance(x, bool) for x in bounds):
        return None  # symbolic bounds stay aten's
    return Presentation("Range", [v.scalar(node, key, x, out.dtype) for key, x in zip(("start", "end", "step"), bounds)])


@_presents(aten.unsqueeze.default)
def _unsqueeze(v: FxView, node: fx.Node, a: dict[str, Any]) -> Presentation | None:
    return Presentation("Unsqueeze", [a["self"], v.const_list(node, "dim", [int(a["dim"])])])


@_presents(aten.squeeze.dim, aten.squeeze.dims)
def _squeeze(v: FxView, node: fx.Node, a: dict[str, Any]) -> Presentation | None:
    src = meta_val(a["self"])
    dims = a["dim"] if isinstance(a["dim"], (list, tuple)) else [a["dim"]]
    if src is None or any(_static(src.shape[int(d)]) != 1 for d in dims):
        return None  # aten keeps a dim that is not 1; ONNX Squeeze would fail
    return Presentation("Squeeze", [a["self"], v.const_list(node, "dim", [int(d) for d in dims])])


def _binary(op_type: str) -> Presenter:
    def present(v: FxView, node: fx.Node, a: dict[str, Any]) -> Presentation | None:
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
                inputs.append(v.scalar(node, key, x, out.dtype))
            else:
                return None
        return Presentation(op_type, inputs)

    return present


for _op, _name in (("add", "Add"), ("sub", "Sub"), ("mul", "Mul"), ("div", "Div")):
    _PRESENTERS[getattr(aten, _op).Tensor] = _PRESENTERS[getattr(aten, _op).Scalar] = _binary(_name)


@_presents(aten.rsub.Scalar)
def _rsub(v: FxView, node: fx.Node, a: dict[str, Any]) -> Presentation | None:
    out = meta_val(node)
    if out is None or a.get("alpha", 1) != 1 or meta_val(a["self"]).dtype != out.dtype:
        return None
    return Presentation("Sub", [v.scalar(node, "other", a["other"], out.dtype), a["self"]])


@_presents(aten.where.self)
def _where(v: FxView, node: fx.Node, a: dict[str, Any]) -> Presentation | None:
    out = meta_val(node)
    if out is None or any(meta_val(a[k]).dtype != out.dtype for k in ("self", "other")):
        return None
    return Presentation("Where", [a["condition"], a["self"], a["other"]])


@_presents(aten.masked_fill.Scalar, aten.masked_fill.Tensor)
def _masked_fill(v: FxView, node: fx.Node, a: dict[str, Any]) -> Presentation | None:
    # masked_fill(x, mask, value) is Where(mask, value, x): the output has x's shape (mask broadcasts to it).
    out, mask, value = meta_val(node), meta_val(a["mask"]), a["value"]
    if out is None or mask is None or mask.dtype != torch.bool or meta_val(a["self"]).shape != out.shape:
        return None
    if isinstance(value, fx.Node):
        if not isinstance(meta_val(value), torch.Tensor) or meta_val(value).dtype != out.dtype:
            return None
        fill: Any = value
    else:
        fill = v.scalar(node, "value", value, out.dtype)
    return Presentation("Where", [a["mask"], fill, a["self"]])


@_presents(aten.pow.Tensor_Scalar)
def _pow(v: FxView, node: fx.Node, a: dict[str, Any]) -> Presentation | None:
    out = meta_val(node)
    if out is None or meta_val(a["self"]).dtype != out.dtype:
        return None
    return Presentation("Pow", [a["self"], v.scalar(node, "exponent", a["exponent"], out.dtype)])


def _unary(op_type: str, **attrs: Any) -> Presenter:
    def present(v: FxView, node: fx.Node, a: dict[str, Any]) -> Presentation | None:
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
def _gelu(v: FxView, node: fx.Node, a: dict[str, Any]) -> Presentation | None:
    return Presentation("Gelu", [a["self"]], {"approximate": str(a["approximate"])})


@_presents(aten.leaky_relu.default)
def _leaky_relu(v: FxView, node: fx.Node, a: dict[str, Any]) -> Presentation | None:
    return Presentation("LeakyRelu", [a["self"]], {"alpha": float(a["negative_slope"])})


@_presents(aten.hardtanh.default, aten.clamp.default)
def _clip(v: FxView, node: fx.Node, a: dict[str, Any]) -> Presentation | None:
    lo, hi = (a["min_val"], a["max_val"]) if node.target is aten.hardtanh.default else (a["min"], a["max"])
    dtype = meta_val(node).dtype
    return Presentation("Clip", [a["self"], None if lo is None else v.scalar(node, "min", lo, dtype),
                                 None if hi is None else v.scalar(node, "max", hi, dtype)])


@_presents(aten._softmax.default)
def _softmax(v: FxView, node: fx.Node, a: dict[str, Any]) -> Presentation | None:
    if a["half_to_float"]:
        return None
    return Presentation("Softmax", [a["self"]], {"axis": int(a["dim"])})


@_presents(aten.mean.dim)
def _reduce_mean(v: FxView, node: fx.Node, a: dict[str, Any]) -> Presentation | None:
    if a["dim"] is None or a.get("dtype") is not None:
        return None
    axes = v.const_list(node, "dim", [int(d) for d in a["dim"]])
    return Presentation("ReduceMean", [a["self"], axes], {"keepdims": int(bool(a["keepdim"]))})


@_presents(aten.native_layer_norm.default)
def _layer_norm(v: FxView, node: fx.Node, a: dict[str, Any]) -> Presentation | None:
    axis = -len(a["normalized_shape"])
    attrs = {"axis": axis, "epsilon": float(a["eps"]), "stash_type": 1}
    return Presentation("LayerNormalization", [a["input"], a["weight"], a["bias"]], attrs)


@_presents(aten.rms_norm.default)
def _rms_norm(v: FxView, node: fx.Node, a: dict[str, Any]) -> Presentation | None:
    if a["weight"] is None or a["eps"] is None:  # no scale, or torch's dtype-dependent default epsilon
        return None
    attrs = {"axis": -len(a["normalized_shape"]), "epsilon": float(a["eps"]), "stash_type": 1}
    return Presentation("RMSNormalization", [a["input"], a["weight"]], attrs)


@_presents(aten.native_group_norm.default)
def _group_norm(v: FxView, node: fx.Node, a: dict[str, Any]) -> Presentation | None:
    # ONNX GroupNormalization (opset 21: per-channel scale and bias) has one output: the
    # group statistics torch also returns must be unread.
    if a["weight"] is None or a["bias"] is None or any(u.target is operator.getitem and u.args[1] != 0 and u.users for u in node.users):
        return None
    attrs = {"num_groups": int(a["group"]), "epsilon": float(a["eps"]), "stash_type": 1}
    return Presentation("GroupNormalization", [a["input"], a["weight"], a["bias"]], attrs)


@_presents(aten._native_batch_norm_legit_no_training.default, aten.native_batch_norm.default)
def _batch_norm(v: FxView, node: fx.Node, a: dict[str, Any]) -> Presentation | None:
    if a.get("training", False):
        return None
    attrs = {"epsilon": float(a["eps"]), "momentum": float(a["momentum"]), "training_mode": 0}
    return Presentation("BatchNormalization", [a["input"], a["weight"], a["bias"], a["running_mean"], a["running_var"]], attrs)


@_presents(aten._to_copy.default, prims.convert_element_type.default)
def _cast(v: FxView, node: fx.Node, a: dict[str, Any]) -> Presentation | None:
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
def _concat(v: FxView, node: fx.Node, a: dict[str, Any]) -> Presentation | None:
    return Presentation("Concat", list(a["tensors"]), {"axis": int(a["dim"])})


@_presents(aten.slice.Tensor)
def _slice(v: FxView, node: fx.Node, a: dict[str, Any]) -> Presentation | None:
    start = 0 if a["start"] is None else _static(a["start"])
    end = _INT64_MAX if a["end"] is None else _static(a["end"])
    if start is None or end is None:
        return None
    return Presentation("Slice", [
        a["self"],
        v.const_list(node, "start", [start]),
        v.const_list(node, "end", [end]),
        v.const_list(node, "dim", [int(a["dim"])]),
        v.const_list(node, "step", [int(a["step"])]),
    ])


@_presents(aten.split.Tensor, aten.split_with_sizes.default)
def _split(v: FxView, node: fx.Node, a: dict[str, Any]) -> Presentation | None:
    outs = meta_val(node)
    if not isinstance(outs, (list, tuple)):
        return None
    axis = int(a["dim"])
    sizes = [_static(o.shape[axis]) for o in outs]
    if None in sizes:
        return None
    return Presentation("Split", [a["self"], v.const_list(node, "split_size", sizes)], {"axis": axis, "num_outputs": len(outs)})


@_presents(aten.constant_pad_nd.default)
def _pad(v: FxView, node: fx.Node, a: dict[str, Any]) -> Presentation | None:
    rank = _rank(a["self"])
    static = [_static(p) for p in a["pad"]]
    pad = [p for p in static if p is not None]
    if rank is None or len(pad) != len(static) or len(pad) % 2 or len(pad) > 2 * rank:
        return None
    # torch lists (begin, end) pairs from the last axis backwards; ONNX all begins, then all ends.
    begins, ends = [0] * rank, [0] * rank
    for k in range(len(pad) // 2):
        begins[rank - 1 - k], ends[rank - 1 - k] = pad[2 * k], pad[2 * k + 1]
    dtype = meta_val(node).dtype
    return Presentation("Pad", [a["self"], v.const_list(node, "pad", begins + ends), v.scalar(node, "value", a["value"], dtype)],
                        {"mode": "constant"})


@_presents(aten.scaled_dot_product_attention.default)
def _sdpa(v: FxView, node: fx.Node, a: dict[str, Any]) -> Presentation | None:
    # ONNX Attention (opset 23) on 4-D q/k/v: the same semantics as SDPA (bool mask True =
    # attend, float mask added, scale default 1/sqrt(head size), grouped heads).
    if a["dropout_p"] != 0.0:
        return None
    attrs: dict[str, Any] = {"is_causal": int(bool(a["is_causal"]))}
    if a.get("scale") is not None:
        attrs["scale"] = float(a["scale"])
    return Presentation("Attention", [a["query"], a["key"], a["value"], a["attn_mask"]], attrs)


# --------------------------------------------------------------------------- the view


@lru_cache(maxsize=4096)
def _schema_default(domain: str, op_type: str, name: str) -> Any:
    try:
        schema = onnx.defs.get_schema(op_type, FX_OPSET, domain)
    except Exception:  # graphopt ops and unknown ops: no schema, no defaults
        return MISSING
    attr = schema.attributes.get(name)
    if attr is None or not attr.default_value.name:
        return MISSING
    value = onnx.helper.get_attribute_value(attr.default_value)
    return value.decode() if isinstance(value, bytes) else value


class FxView:
    """GraphView over an FX GraphModule of ATen ops; one scope (the graph)."""

    def __init__(self, gm: fx.GraphModule, fake_mode: Any = None, device: torch.device | str | None = None) -> None:
        self.gm = gm
        self.graph = gm.graph
        self.fake_mode = fake_mode if fake_mode is not None else _detect_fake_mode(gm)
        self.device = torch.device(device) if device is not None else _main_device(gm)
        self._presented: dict[fx.Node, Presentation | None] = {}
        self._consts: dict[tuple[fx.Node, str], InlineConst] = {}
        self._phantoms: dict[tuple[fx.Node, int], _Phantom] = {}
        self._arrays: dict[fx.Node, np.ndarray] = {}
        self._pending: list[fx.Node] = []
        self._pending_attrs: list[str] = []
        self._counter = itertools.count()

    # ------------------------------------------------------------ bookkeeping
    def refresh(self) -> None:
        """Forget cached presentations (after a pass outside the view changed the graph)."""
        self._presented.clear()

    def present(self, node: fx.Node) -> Presentation | None:
        if node not in self._presented:
            self._presented[node] = self._present(node)
        return self._presented[node]

    def _present(self, node: fx.Node) -> Presentation | None:
        if node.op != "call_function" or is_neutral(node):
            return None
        presenter = _PRESENTERS.get(node.target)
        if presenter is None or not isinstance(meta_val(node), (torch.Tensor, tuple, list)):
            return None
        try:
            return presenter(self, node, _arguments(node))
        except (KeyError, TypeError, AttributeError, IndexError):  # an argument form the presenter does not know
            return None

    def scalar(self, node: fx.Node, key: str, value: Any, dtype: torch.dtype) -> InlineConst:
        """The constant standing for a Python number in `node`'s argument `key`."""
        np_dtype = np.dtype(_numpy_dtype(dtype))
        return self._interned(node, key, np.asarray(value, dtype=np_dtype), value)

    def const_list(self, node: fx.Node, key: str, values: Sequence[Any]) -> Any:
        """An int64 vector constant for an int-list argument; a symbolic list stays a non-constant value."""
        ints = [_static(x) for x in values]
        if None in ints:
            return self._interned(node, key, None, list(values))
        return self._interned(node, key, np.asarray(ints, dtype=np.int64), list(values))

    def _interned(self, node: fx.Node, key: str, array: np.ndarray | None, raw: Any) -> InlineConst:
        # The matcher compares values by identity: the same argument must give the same object.
        found = self._consts.get((node, key))
        if found is not None and _same_raw(found.raw, raw):
            return found
        const = InlineConst(array, f"{node.name}.{key}", raw)
        self._consts[(node, key)] = const
        return const

    # ------------------------------------------------------------ scopes
    def scopes(self) -> list[fx.Graph]:
        return [self.graph]

    def nodes(self, scope: Any) -> list[fx.Node]:
        return [n for n in self.graph.nodes if n.op == "call_function" and not _is_projection(n)]

    def scope_of(self, node: Any) -> fx.Graph | None:
        if not isinstance(node, fx.Node) or getattr(node, "_erased", False) or node.graph is not self.graph:
            return None
        return self.graph

    def scope_label(self, scope: Any) -> str:
        return "main"

    def iter_all_nodes(self) -> Iterator[fx.Node]:
        yield from self.nodes(self.graph)

    def opset(self, domain: str) -> int | None:
        if domain in ("", "ai.onnx"):
            return FX_OPSET
        return 1 if domain == "graphopt" else None

    # ------------------------------------------------------------ reading
    def op_key(self, node: fx.Node) -> tuple[str, str]:
        if is_neutral(node):
            return ("graphopt", node.target.op_type)  # type: ignore[union-attr]
        p = self.present(node)
        if p is not None:
            return (p.domain, p.op_type)
        return ("torch", _target_name(node))

    def inputs(self, node: fx.Node) -> Sequence[Any]:
        if is_neutral(node):
            return list(node.args)
        p = self.present(node)
        if p is not None:
            return p.inputs
        return _tensor_args(node)

    def outputs(self, node: fx.Node) -> list[Any]:
        val = meta_val(node)
        if not isinstance(val, (tuple, list)):
            return [node]
        found: dict[int, fx.Node] = {}
        for user in node.users:
            if user.target is operator.getitem and isinstance(user.args[1], int):
                found.setdefault(user.args[1], user)
        return [found.get(i) or self._phantom(node, i) for i in range(len(val))]

    def _phantom(self, node: fx.Node, index: int) -> _Phantom:
        key = (node, index)
        if key not in self._phantoms:
            self._phantoms[key] = _Phantom(node, index)
        return self._phantoms[key]

    def producer(self, value: Any) -> fx.Node | None:
        if isinstance(value, _Phantom):
            return value.node
        if not isinstance(value, fx.Node) or value.op != "call_function":
            return None
        return value.args[0] if _is_projection(value) else value  # type: ignore[return-value]

    def output_index(self, value: Any) -> int:
        if isinstance(value, _Phantom):
            return value.index
        if isinstance(value, fx.Node) and _is_projection(value):
            return int(value.args[1])  # type: ignore[arg-type]
        return 0

    def users(self, value: Any) -> list[fx.Node]:
        if not isinstance(value, fx.Node):
            return []
        found: list[fx.Node] = []
        for user in value.users:
            if user.op == "output" or getattr(user, "_erased", False):
                continue
            uses = sum(1 for x in _tensor_args(user) if x is value)
            found.extend([user] * max(uses, 1))
        return found

    def is_graph_output(self, value: Any) -> bool:
        return isinstance(value, fx.Node) and any(u.op == "output" for u in value.users)

    def is_const(self, value: Any) -> bool:
        if isinstance(value, InlineConst):
            return value.array is not None
        return isinstance(value, fx.Node) and value.op == "get_attr" and isinstance(self._attr_tensor(value), torch.Tensor)

    def const_array(self, value: Any) -> np.ndarray | None:
        if isinstance(value, InlineConst):
            return value.array
        if not self.is_const(value):
            return None
        if value not in self._arrays:
            self._arrays[value] = tensor_to_numpy(self._attr_tensor(value))
        return self._arrays[value]

    def _attr_tensor(self, node: fx.Node) -> Any:
        obj: Any = self.gm
        for part in str(node.target).split("."):
            obj = getattr(obj, part, None)
        return obj

    def dtype(self, value: Any) -> str | None:
        if isinstance(value, InlineConst):
            return None if value.array is None else _numpy_dtype_name(value.array.dtype)
        val = self._value_meta(value)
        if isinstance(val, torch.Tensor):
            return torch_dtype_name(val.dtype)
        if isinstance(val, (int, torch.SymInt)):
            return "i64"
        return None

    def shape(self, value: Any) -> tuple[int | str | None, ...] | None:
        if isinstance(value, InlineConst):
            return None if value.array is None else tuple(value.array.shape)
        val = self._value_meta(value)
        if isinstance(val, torch.Tensor):
            return tuple(_dim(d) for d in val.shape)
        if isinstance(val, (int, torch.SymInt)):
            return ()
        return None

    def _value_meta(self, value: Any) -> Any:
        if isinstance(value, _Phantom):
            val = meta_val(value.node)
            return val[value.index] if isinstance(val, (tuple, list)) else None
        return meta_val(value)

    def attr(self, node: fx.Node, name: str) -> Any:
        attrs = self.attrs(node)
        if name in attrs:
            return attrs[name]
        domain, op_type = self.op_key(node)
        return _schema_default(domain, op_type, name) if domain in ("", "graphopt") else MISSING

    def attrs(self, node: fx.Node) -> Mapping[str, Any]:
        if is_neutral(node):
            return node.meta.get("graphopt_attrs", {})
        p = self.present(node)
        return p.attrs if p is not None else {}

    def raw_attrs(self, node: fx.Node) -> Mapping[str, Any]:
        return dict(self.attrs(node))

    def label(self, node: fx.Node) -> str:
        return node.name

    # ------------------------------------------------------------ mutating
    def fresh_name(self, hint: str) -> str:
        hint = "".join(c if c.isalnum() else "_" for c in hint) or "v"
        while True:
            name = f"_go_{hint}_{next(self._counter)}"
            if not hasattr(self.gm, name):
                return name

    def new_node(
        self,
        scope: Any,
        domain: str,
        op_type: str,
        inputs: Sequence[Any],
        attrs: Mapping[str, Any],
        num_outputs: int,
        name_hint: str = "",
    ) -> fx.Node:
        output = self._output_node()
        with self.graph.inserting_before(output):
            builder = torch_lowering.FxBuilder(
                self.graph, self.fake_mode, created=self._pending, constant=self._new_tensor_constant, const_array=self.const_array,
                device=self.device,
            )
            args = [self._as_fx(x) for x in inputs]
            if domain == "graphopt":
                return torch_lowering.neutral_node(builder, op_type, args, dict(attrs), num_outputs)
            if domain:
                raise RewriteDeclined(f"the torch graph cannot take {domain}.{op_type}")
            return torch_lowering.emit_canonical(builder, op_type, args, dict(attrs), num_outputs)

    def new_constant(self, scope: Any, array: np.ndarray, name_hint: str) -> fx.Node:
        return self._new_tensor_constant(numpy_to_tensor(np.asarray(array), self.device), name_hint)

    def add_constant(self, tensor: torch.Tensor, name_hint: str = "const") -> fx.Node:
        """A constant node for `tensor`, kept at once (for passes; rewrites use new_constant)."""
        node = self._new_tensor_constant(tensor, name_hint)
        self._pending.remove(node)
        self._pending_attrs.remove(str(node.target))
        return node

    def _new_tensor_constant(self, tensor: torch.Tensor, name_hint: str = "const") -> fx.Node:
        name = self.fresh_name(name_hint)
        self.gm.register_buffer(name, tensor)
        self._pending_attrs.append(name)
        first = next(n for n in self.graph.nodes if n.op != "placeholder")
        with self.graph.inserting_before(first):
            node = self.graph.get_attr(name)
        node.meta["val"] = self.fake_tensor(tensor)
        self._pending.append(node)
        return node

    def fake_tensor(self, tensor: torch.Tensor) -> Any:
        if self.fake_mode is None:
            return tensor
        return self.fake_mode.from_tensor(tensor, static_shapes=True)

    def _as_fx(self, value: Any) -> Any:
        """A value as an FX argument: nodes as they are, constants as Python values or get_attr nodes."""
        if value is None or isinstance(value, fx.Node):
            return value
        if isinstance(value, _Phantom):
            return self._projection(value)
        if isinstance(value, InlineConst):
            return value  # lowerings read its array, or `raw` for a symbolic int list
        raise TypeError(f"cannot use {value!r} as an FX argument")

    def _projection(self, phantom: _Phantom) -> fx.Node:
        for user in phantom.node.users:
            if user.target is operator.getitem and user.args[1] == phantom.index:
                return user
        with self.graph.inserting_after(phantom.node):
            node = self.graph.call_function(operator.getitem, (phantom.node, phantom.index))
        node.meta["val"] = meta_val(phantom.node)[phantom.index]
        self._pending.append(node)  # erased again if the rewrite is discarded
        return node

    def _output_node(self) -> fx.Node:
        return next(iter(reversed(self.graph.nodes)))

    def discard_pending(self) -> None:
        for node in reversed(self._pending):
            if not getattr(node, "_erased", False):
                for user in list(node.users):
                    if user.target is operator.getitem and not user.users:
                        self.graph.erase_node(user)
                self.graph.erase_node(node)
        for name in self._pending_attrs:
            if hasattr(self.gm, name):
                delattr(self.gm, name)
        self._pending, self._pending_attrs = [], []

    def commit(
        self,
        root: fx.Node,
        new_nodes: Sequence[fx.Node],
        replacements: Sequence[tuple[Any, Any]],
        matched: Sequence[fx.Node],
        *,
        provenance: Mapping[str, str] | None = None,
    ) -> list[fx.Node]:
        pending, self._pending, self._pending_attrs = self._pending, [], []
        pending_set = set(pending)
        replaced = [n.name for n in matched]
        for node in pending:  # constants stay at the top of the graph; computations move before the root
            if node.op == "call_function":
                root.prepend(node)
            if provenance is not None:  # graphopt.ir.provenance's keys, kept in the node's meta
                node.meta.update(provenance)
                node.meta["graphopt.replaced"] = ",".join(replaced)
        root_outputs = set(map(id, self.outputs(root)))
        needs_sort = False
        results: list[fx.Node] = []
        for old, new in replacements:
            if isinstance(old, _Phantom):
                continue  # an output nobody reads
            new_fx = self._replacement(new)
            results.append(new_fx)
            needs_sort = needs_sort or id(old) not in root_outputs
            old.replace_all_uses_with(new_fx, delete_user_cb=lambda user: user not in pending_set, propagate_meta=False)
        self._pending, self._pending_attrs = [], []  # what the replacements made is committed too
        if needs_sort:
            # The rewrite replaced an interior value, whose users may come before the new nodes.
            _topological_sort(self.graph)
        self._presented.clear()
        touched = [u for value in results for u in value.users if u.op == "call_function"]
        touched.extend(self._erase_unused(list(matched)))
        return [n for n in touched if not getattr(n, "_erased", False) and not _is_projection(n)]

    def _replacement(self, new: Any) -> fx.Node:
        if isinstance(new, _Phantom):
            return self._projection(new)
        if isinstance(new, InlineConst):
            if new.array is None:
                raise AssertionError(f"{new.name} is a symbolic list, not a tensor")
            tensor = numpy_to_tensor(new.array, self.device)
            return self._new_tensor_constant(tensor, new.name)
        return new

    def _erase_unused(self, candidates: list[fx.Node]) -> list[fx.Node]:
        """Erase candidates left without users (and their dead getitems), then producers
        left without users. Returns the survivors whose use counts dropped."""
        survivors: list[fx.Node] = []
        while candidates:
            node = candidates.pop()
            if getattr(node, "_erased", False) or node.op != "call_function":
                continue
            for user in list(node.users):
                if _is_projection(user) and not user.users:
                    self.graph.erase_node(user)
            if node.users or node.is_impure(impure_random=False):
                survivors.append(node)
                continue
            producers = [self.producer(x) for x in _tensor_args(node)]
            self.graph.erase_node(node)
            candidates.extend(p for p in producers if p is not None)
        return survivors


# --------------------------------------------------------------------------- helpers


def _dim(d: Any) -> int | str:
    static = _static(d)
    if static is not None:
        return static
    return str(d.node.expr) if isinstance(d, torch.SymInt) else str(d)


def _numpy_dtype(dtype: torch.dtype) -> Any:
    if dtype == torch.bfloat16:
        import ml_dtypes

        return ml_dtypes.bfloat16
    return torch.empty((), dtype=dtype).numpy().dtype


def _numpy_dtype_name(dtype: np.dtype) -> str | None:
    if dtype.name == "bfloat16":
        return "bf16"
    return {
        "float32": "f32", "float16": "f16", "float64": "f64", "int64": "i64", "int32": "i32", "int16": "i16",
        "int8": "i8", "uint8": "u8", "bool": "bool",
    }.get(dtype.name)


def _same_raw(a: Any, b: Any) -> bool:
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return len(a) == len(b) and all(_same_raw(x, y) for x, y in zip(a, b))
    return type(a) is type(b) and (a is b or a == b or (isinstance(a, float) and math.isnan(a) and math.isnan(b)))


def _target_name(node: fx.Node) -> str:
    target = node.target
    if isinstance(target, torch._ops.OpOverload):
        return str(target)
    return getattr(target, "__name__", str(target))


def _detect_fake_mode(gm: fx.GraphModule) -> Any:
    from torch._guards import detect_fake_mode

    return detect_fake_mode([n.meta.get("val") for n in gm.graph.nodes if "val" in n.meta])


def _main_device(gm: fx.GraphModule) -> torch.device:
    """The device of the first tensor input or constant: where new constants go."""
    for node in gm.graph.nodes:
        val = meta_val(node)
        if isinstance(val, torch.Tensor) and node.op in ("placeholder", "get_attr"):
            return val.device
    return torch.device("cpu")


def _topological_sort(graph: fx.Graph) -> None:
    """Reorder the graph so that every node follows its inputs, keeping the existing
    order wherever it is already valid (Kahn's algorithm, smallest position first)."""
    import heapq

    nodes = list(graph.nodes)
    output = nodes[-1]
    order = {n: i for i, n in enumerate(nodes)}
    pending = {n: len(set(n.all_input_nodes)) for n in nodes}
    ready = [(order[n], n) for n in nodes if pending[n] == 0 and n is not output]
    heapq.heapify(ready)
    result: list[fx.Node] = []
    while ready:
        _, node = heapq.heappop(ready)
        result.append(node)
        for user in node.users:
            pending[user] -= 1
            if pending[user] == 0 and user is not output:
                heapq.heappush(ready, (order[user], user))
    if len(result) != len(nodes) - 1:
        raise AssertionError("the rewritten graph has a cycle")
    if result == nodes[:-1]:
        return
    for node in result:
        output.prepend(node)
