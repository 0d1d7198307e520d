"""Lowering onto torch: canonical ops back to ATen calls, graphopt ops to torch.ops.graphopt.

Two tables, one per kind of op a rule builds on an FX graph (graphopt.ir.fx_view):

* `CANONICAL` -- a standard ONNX op (Conv, Gemm, Reshape, Cast, ...) becomes the
  ATen call(s) with that meaning, at once, when the rewrite is planned;
* `GRAPHOPT` -- a graphopt op (graphopt.SkipLayerNorm, graphopt.MultiHeadAttention,
  ...) first becomes a *neutral* node that later rules can still match, and after
  the rules ran (`lower_neutral_nodes`) the torch custom op it runs on
  (``torch.ops.graphopt.*``, registered by graphopt.kernels), with view/permute
  adapters where the layouts differ, or plain ATen ops where no custom op fits.

`torch_target` turns the tables into a `graphopt.ops.targets.Target` the driver
checks every rewrite against, exactly as for the ONNX targets: a graphopt op whose
custom op is not registered has no lowering, and when gradients flow (training)
neither has one whose custom op has no registered backward.
"""

from __future__ import annotations

import functools
import operator
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import torch
import torch.fx as fx

from graphopt.ir.dtypes import onnx_enum_to_name
from graphopt.ir.fx_values import InlineConst, is_neutral, meta_val, neutral_op, numpy_to_tensor, torch_dtype_from_name
from graphopt.ops import registry
from graphopt.ops.targets import Lowering, Target
from graphopt.pattern.native import RewriteDeclined

__all__ = [
    "FxBuilder",
    "CANONICAL",
    "GRAPHOPT",
    "GraphoptLowering",
    "emit_canonical",
    "neutral_node",
    "lower_neutral_nodes",
    "torch_target",
    "custom_op_problem",
    "ensure_kernels",
    "unavailable_graphopt_ops",
    "PREFERRED_OVER_INDUCTOR",
]

aten = torch.ops.aten
prims = torch.ops.prims
_ALL_DTYPES = frozenset({"f32", "f16", "bf16", "f64", "i64", "i32", "i16", "i8", "u8", "bool"})
_FLOATS = frozenset({"f32", "f16", "bf16"})


# --------------------------------------------------------------------------- building FX nodes


class FxBuilder:
    """Emits ATen calls as FX nodes at the graph's current insertion point, each with its
    ``meta["val"]`` computed on fake tensors; or, with ``evaluate=True``, just runs them
    on fake tensors (to learn what a lowering would produce before emitting it)."""

    def __init__(
        self,
        graph: fx.Graph | None,
        fake_mode: Any,
        *,
        created: list[fx.Node] | None = None,
        constant: Callable[[torch.Tensor, str], Any] | None = None,
        const_array: Callable[[Any], Any] | None = None,
        evaluate: bool = False,
        device: torch.device | str = "cpu",
    ) -> None:
        self.graph = graph
        self.device = device  # where constants made from inline numbers go
        self.fake_mode = fake_mode
        self.created = created if created is not None else []
        self._constant = constant
        self._const_array = const_array
        self.evaluate = evaluate

    def const_array(self, x: Any) -> Any:
        """The contents of a constant node (a numpy array), or None."""
        return self._const_array(x) if self._const_array is not None and isinstance(x, fx.Node) else None

    def meta(self, x: Any) -> Any:
        return meta_val(x) if isinstance(x, fx.Node) else x

    def call(self, target: Any, *args: Any, **kwargs: Any) -> Any:
        if self.evaluate:
            return self._run(target, args, kwargs)
        fake_args, fake_kwargs = fx.node.map_arg((args, kwargs), self.meta)
        try:
            val = self._run(target, fake_args, fake_kwargs)
        except RewriteDeclined:
            raise
        except Exception as error:  # the op refuses these inputs: the rewrite is not valid here
            raise RewriteDeclined(f"{target} refuses the rewrite's inputs: {_first_line(error)}") from None
        assert self.graph is not None
        node = self.graph.call_function(target, tuple(args), dict(kwargs))
        node.meta["val"] = val
        self.created.append(node)
        return node

    def value_of(self, x: Any, depth: int = 0) -> torch.Tensor | None:
        """x's value where it follows from constants and static shapes alone (the shape
        arithmetic rewrites build: Shape, Slice, Concat, Squeeze, ...), computed on real
        tensors; None where it depends on the graph's inputs."""
        if isinstance(x, InlineConst):
            return None if x.array is None else numpy_to_tensor(x.array)
        if not isinstance(x, fx.Node) or depth > 16:
            return None
        array = self.const_array(x)
        if array is not None:
            return numpy_to_tensor(array)
        if x.op != "call_function" or not isinstance(x.target, torch._ops.OpOverload):
            return None
        if x.target is aten._shape_as_tensor.default:
            dims = self.shape(x.args[0])
            return torch.tensor(dims, dtype=torch.int64) if all(isinstance(d, int) for d in dims) else None
        missing = []

        def value(node: fx.Node) -> Any:
            found = self.value_of(node, depth + 1)
            if found is None:
                missing.append(node)
            return found

        args, kwargs = fx.node.map_arg((x.args, x.kwargs), value)
        if missing:
            return None
        try:
            result = x.target(*args, **kwargs)
        except Exception:  # noqa: BLE001 - not computable here: treated as a run-time value
            return None
        return result if isinstance(result, torch.Tensor) else None

    def call_with_value(self, target: Any, value: torch.Tensor, *args: Any) -> Any:
        """A call whose result is known (`value`) and is not to be computed on fake tensors."""
        fake = self.fake_mode.from_tensor(value, static_shapes=True) if self.fake_mode is not None else value
        if self.evaluate:
            return fake
        assert self.graph is not None
        node = self.graph.call_function(target, tuple(args), {})
        node.meta["val"] = fake
        self.created.append(node)
        return node

    def _run(self, target: Any, args: Any, kwargs: Any) -> Any:
        if self.fake_mode is None:
            return target(*args, **kwargs)
        with self.fake_mode:
            return target(*args, **kwargs)

    def item(self, x: Any, index: int) -> Any:
        if self.evaluate:
            return x[index]
        return self.call(operator.getitem, x, index)

    def shape(self, x: Any) -> tuple[Any, ...]:
        return tuple(self.meta(x).shape)

    def rank(self, x: Any) -> int:
        return int(self.meta(x).dim())

    def size(self, x: Any, dim: int) -> Any:
        """Dim `dim` of x: an int when static, else a SymInt (evaluating) or a sym_size node."""
        d = self.meta(x).shape[dim]
        if isinstance(d, int) or (isinstance(d, torch.SymInt) and d.node.expr.is_number):
            return int(d)
        return d if self.evaluate else self.call(aten.sym_size.int, x, dim % self.rank(x))

    def constant(self, tensor: torch.Tensor, name: str = "const") -> Any:
        if self.evaluate:
            return self.fake_mode.from_tensor(tensor, static_shapes=True) if self.fake_mode is not None else tensor
        if self._constant is None:
            raise RewriteDeclined("no place for new constants in this graph")
        return self._constant(tensor, name)

    def tensor(self, x: Any, like: Any = None) -> Any:
        """x as a tensor argument: a constant operand becomes a (0-d or vector) constant tensor."""
        if isinstance(x, InlineConst):
            if x.array is None:
                raise RewriteDeclined(f"{x.name} is not a constant tensor")
            device = self.meta(like).device if like is not None else self.device
            return self.constant(numpy_to_tensor(x.array, device), x.name)
        return x


def _number(x: Any) -> Any:
    """The Python number a scalar constant stands for."""
    if isinstance(x, InlineConst) and x.array is not None and x.array.size == 1:
        return x.array.reshape(-1)[0].item()
    return None


def _ints(b: FxBuilder, x: Any) -> list[Any] | None:
    """An int list operand: a constant vector (inline or a constant node), the symbolic
    list an aten node was given, or the dims of a tensor whose Shape it is."""
    if isinstance(x, InlineConst):
        if x.array is not None:
            return [int(i) for i in x.array.reshape(-1)]
        return list(x.raw) if isinstance(x.raw, (list, tuple)) else None
    if isinstance(x, fx.Node) and x.target is aten._shape_as_tensor.default:  # Shape(src): src's dims, symbolic ones too
        src = x.args[0]
        return [b.size(src, i) for i in range(b.rank(src))]
    value = b.value_of(x)  # shape arithmetic on static dims
    if value is not None and not value.is_floating_point() and value.dim() <= 1:
        return [int(i) for i in value.reshape(-1).tolist()]
    array = b.const_array(x)
    if array is not None and array.dtype.kind in "iu":
        return [int(i) for i in array.reshape(-1)]
    return None


# --------------------------------------------------------------------------- canonical ops -> ATen

Emitter = Callable[[FxBuilder, list[Any], dict[str, Any], int], Any]
CANONICAL: dict[str, Emitter] = {}


def _emits(*op_types: str) -> Callable[[Emitter], Emitter]:
    def register(fn: Emitter) -> Emitter:
        for op in op_types:
            CANONICAL[op] = fn
        return fn

    return register


def emit_canonical(b: FxBuilder, op_type: str, args: list[Any], attrs: dict[str, Any], num_outputs: int) -> Any:
    """Emit the ATen call(s) for a standard ONNX op; returns the node that produces its outputs."""
    emitter = CANONICAL.get(op_type)
    if emitter is None:
        raise RewriteDeclined(f"target torch has no kernel for {op_type}")
    return emitter(b, list(args), attrs, num_outputs)


def _arg(args: list[Any], i: int) -> Any:
    return args[i] if i < len(args) else None


def _conv_common(b: FxBuilder, args: list[Any], attrs: dict[str, Any], transposed: bool) -> Any:
    x, w, bias = _arg(args, 0), b.tensor(_arg(args, 1)), _arg(args, 2)
    spatial = b.rank(w) - 2
    if attrs.get("auto_pad", "NOTSET") not in ("NOTSET", b"NOTSET"):
        raise RewriteDeclined("aten.convolution takes explicit pads only")
    pads = [int(p) for p in attrs.get("pads", [0] * (2 * spatial))]
    if pads[:spatial] != pads[spatial:]:
        raise RewriteDeclined(f"aten.convolution pads both sides equally, not {pads}")
    strides = [int(s) for s in attrs.get("strides", [1] * spatial)]
    dilations = [int(d) for d in attrs.get("dilations", [1] * spatial)]
    output_padding = [int(p) for p in attrs.get("output_padding", [0] * spatial)] if transposed else [0] * spatial
    bias = b.tensor(bias, like=x) if bias is not None else None
    return b.call(aten.convolution.default, x, w, bias, strides, pads[:spatial], dilations, transposed, output_padding, int(attrs.get("group", 1)))


@_emits("Conv")
def _conv(b: FxBuilder, args: list[Any], attrs: dict[str, Any], n: int) -> Any:
    return _conv_common(b, args, attrs, transposed=False)


@_emits("ConvTranspose")
def _conv_transpose(b: FxBuilder, args: list[Any], attrs: dict[str, Any], n: int) -> Any:
    return _conv_common(b, args, attrs, transposed=True)


@_emits("Gemm")
def _gemm(b: FxBuilder, args: list[Any], attrs: dict[str, Any], n: int) -> Any:
    a, m, c = b.tensor(args[0]), b.tensor(args[1]), _arg(args, 2)
    if int(attrs.get("transA", 0)):
        a = b.call(aten.permute.default, a, [1, 0])
    if int(attrs.get("transB", 0)):
        m = b.call(aten.permute.default, m, [1, 0])
    alpha, beta = float(attrs.get("alpha", 1.0)), float(attrs.get("beta", 1.0))
    if c is None:
        product = b.call(aten.mm.default, a, m)
        return product if alpha == 1.0 else b.call(aten.mul.Tensor, product, alpha)
    return b.call(aten.addmm.default, b.tensor(c, like=a), a, m, beta=beta, alpha=alpha)


@_emits("MatMul")
def _matmul(b: FxBuilder, args: list[Any], attrs: dict[str, Any], n: int) -> Any:
    return b.call(aten.matmul.default, b.tensor(args[0]), b.tensor(args[1]))


@_emits("Shape")
def _shape(b: FxBuilder, args: list[Any], attrs: dict[str, Any], n: int) -> Any:
    """aten._shape_as_tensor: the Reshape emitter reads the dims of its source from it (symbolic ones too);
    its fake value is made here, since fake tensors cannot run it (it reads sizes into data)."""
    x = b.tensor(args[0])
    dims = [int(d) if isinstance(d, int) else None for d in b.shape(x)]
    if None in dims:
        raise RewriteDeclined("the torch graph takes a Shape of static dims only")
    shape = b.call_with_value(aten._shape_as_tensor.default, torch.tensor(dims, dtype=torch.int64), x)
    start, end = int(attrs.get("start", 0)), attrs.get("end")
    if start == 0 and end is None:
        return shape
    return b.call(aten.slice.Tensor, shape, 0, start, None if end is None else int(end))


@_emits("Range")
def _range(b: FxBuilder, args: list[Any], attrs: dict[str, Any], n: int) -> Any:
    """aten.arange of numbers known when the rewrite is planned (constants, static shape arithmetic)."""
    values = [b.value_of(a) for a in args[:3]]
    if any(v is None or v.numel() != 1 for v in values):
        raise RewriteDeclined("Range bounds are computed at run time")
    start, limit, delta = (v.reshape(()).item() for v in values)  # type: ignore[union-attr]
    return b.call(aten.arange.start_step, start, limit, delta, dtype=values[0].dtype, device=b.device)  # type: ignore[union-attr]


@_emits("Transpose")
def _transpose(b: FxBuilder, args: list[Any], attrs: dict[str, Any], n: int) -> Any:
    x = b.tensor(args[0])
    perm = attrs.get("perm") or list(range(b.rank(x)))[::-1]
    return b.call(aten.permute.default, x, [int(p) for p in perm])


@_emits("Reshape")
def _reshape(b: FxBuilder, args: list[Any], attrs: dict[str, Any], n: int) -> Any:
    x, shape = b.tensor(args[0]), _ints(b, args[1])
    if shape is None:
        raise RewriteDeclined("the target shape is computed at run time")
    allowzero = int(attrs.get("allowzero", 0))
    dims = [b.size(x, i) if (not allowzero and isinstance(s, int) and s == 0) else s for i, s in enumerate(shape)]
    return b.call(aten.reshape.default, x, dims)


def _binary(target: Any, swapped: Any = None) -> Emitter:
    """Tensor op tensor, tensor op number, or number op tensor (commutative ops swap; others get a 0-d constant)."""

    def emit(b: FxBuilder, args: list[Any], attrs: dict[str, Any], n: int) -> Any:
        x, y = args[0], args[1]
        if isinstance(y, InlineConst) and _number(y) is not None and not isinstance(x, InlineConst):
            return b.call(target, x, _number(y))
        if isinstance(x, InlineConst) and not isinstance(y, InlineConst):
            if swapped is not None and _number(x) is not None:
                return b.call(swapped, y, _number(x))
            return b.call(target, b.tensor(x, like=y), y)
        return b.call(target, b.tensor(x), b.tensor(y))

    return emit


CANONICAL["Add"] = _binary(aten.add.Tensor, aten.add.Tensor)
CANONICAL["Mul"] = _binary(aten.mul.Tensor, aten.mul.Tensor)
CANONICAL["Sub"] = _binary(aten.sub.Tensor, aten.rsub.Scalar)
CANONICAL["Div"] = _binary(aten.div.Tensor)


@_emits("Pow")
def _pow(b: FxBuilder, args: list[Any], attrs: dict[str, Any], n: int) -> Any:
    x, e = b.tensor(args[0]), args[1]
    if _number(e) is not None:
        return b.call(aten.pow.Tensor_Scalar, x, _number(e))
    return b.call(aten.pow.Tensor_Tensor, x, b.tensor(e, like=x))


@_emits("Where")
def _where(b: FxBuilder, args: list[Any], attrs: dict[str, Any], n: int) -> Any:
    cond = b.tensor(args[0])
    like = next((a for a in args[1:] if not isinstance(a, InlineConst)), cond)
    return b.call(aten.where.self, cond, b.tensor(args[1], like=like), b.tensor(args[2], like=like))


def _unary(target: Any) -> Emitter:
    def emit(b: FxBuilder, args: list[Any], attrs: dict[str, Any], n: int) -> Any:
        return b.call(target, b.tensor(args[0]))

    return emit


for _op, _target in (
    ("Relu", aten.relu.default), ("Sigmoid", aten.sigmoid.default), ("Tanh", aten.tanh.default),
    ("Erf", aten.erf.default), ("Sqrt", aten.sqrt.default), ("Reciprocal", aten.reciprocal.default),
    ("Exp", aten.exp.default), ("Log", aten.log.default), ("Neg", aten.neg.default), ("Abs", aten.abs.default),
    ("IsNaN", aten.isnan.default), ("Sin", aten.sin.default), ("Cos", aten.cos.default),
):
    CANONICAL[_op] = _unary(_target)


@_emits("Cast")
def _cast(b: FxBuilder, args: list[Any], attrs: dict[str, Any], n: int) -> Any:
    name = onnx_enum_to_name(int(attrs["to"]))
    if name is None:
        raise RewriteDeclined(f"no torch type for ONNX type {attrs['to']}")
    return b.call(prims.convert_element_type.default, b.tensor(args[0]), torch_dtype_from_name(name))


@_emits("Gelu")
def _gelu(b: FxBuilder, args: list[Any], attrs: dict[str, Any], n: int) -> Any:
    approximate = attrs.get("approximate", "none")
    return b.call(aten.gelu.default, b.tensor(args[0]), approximate=approximate.decode() if isinstance(approximate, bytes) else approximate)


@_emits("Swish")
def _swish(b: FxBuilder, args: list[Any], attrs: dict[str, Any], n: int) -> Any:
    x, alpha = b.tensor(args[0]), float(attrs.get("alpha", 1.0))
    if alpha == 1.0:
        return b.call(aten.silu.default, x)
    return b.call(aten.mul.Tensor, x, b.call(aten.sigmoid.default, b.call(aten.mul.Tensor, x, alpha)))


@_emits("LeakyRelu")
def _leaky_relu(b: FxBuilder, args: list[Any], attrs: dict[str, Any], n: int) -> Any:
    return b.call(aten.leaky_relu.default, b.tensor(args[0]), float(attrs.get("alpha", 0.01)))


@_emits("Clip")
def _clip(b: FxBuilder, args: list[Any], attrs: dict[str, Any], n: int) -> Any:
    lo, hi = _number(_arg(args, 1)), _number(_arg(args, 2))
    if (_arg(args, 1) is not None and lo is None) or (_arg(args, 2) is not None and hi is None):
        raise RewriteDeclined("Clip bounds are not constant numbers")
    return b.call(aten.clamp.default, b.tensor(args[0]), lo, hi)


@_emits("HardSigmoid")
def _hard_sigmoid(b: FxBuilder, args: list[Any], attrs: dict[str, Any], n: int) -> Any:
    x, alpha, beta = b.tensor(args[0]), float(attrs.get("alpha", 0.2)), float(attrs.get("beta", 0.5))
    if abs(alpha - 1.0 / 6.0) < 1e-7 and beta == 0.5:
        return b.call(aten.hardsigmoid.default, x)
    return b.call(aten.clamp.default, b.call(aten.add.Tensor, b.call(aten.mul.Tensor, x, alpha), beta), 0.0, 1.0)


CANONICAL["HardSwish"] = _unary(aten.hardswish.default)
CANONICAL["Softplus"] = _unary(aten.softplus.default)
CANONICAL["Mish"] = _unary(aten.mish.default)


@_emits("Softmax")
def _softmax(b: FxBuilder, args: list[Any], attrs: dict[str, Any], n: int) -> Any:
    return b.call(aten._softmax.default, b.tensor(args[0]), int(attrs.get("axis", -1)), False)


@_emits("ReduceMean")
def _reduce_mean(b: FxBuilder, args: list[Any], attrs: dict[str, Any], n: int) -> Any:
    x = b.tensor(args[0])
    axes = _ints(b, _arg(args, 1)) if _arg(args, 1) is not None else attrs.get("axes")
    if axes is None:
        axes = list(range(b.rank(x)))
    return b.call(aten.mean.dim, x, [int(a) for a in axes], bool(int(attrs.get("keepdims", 1))))


@_emits("Concat")
def _concat(b: FxBuilder, args: list[Any], attrs: dict[str, Any], n: int) -> Any:
    like = next((a for a in args if not isinstance(a, InlineConst)), None)
    return b.call(aten.cat.default, [b.tensor(a, like=like) for a in args], int(attrs["axis"]))


@_emits("Split")
def _split(b: FxBuilder, args: list[Any], attrs: dict[str, Any], n: int) -> Any:
    x = b.tensor(args[0])
    axis = int(attrs.get("axis", 0))
    sizes = _ints(b, _arg(args, 1)) if _arg(args, 1) is not None else None
    if sizes is None:
        width = b.size(x, axis)
        parts = int(attrs.get("num_outputs", n))
        if not isinstance(width, int) or width % parts:
            raise RewriteDeclined(f"Split of {width} into {parts} equal parts")
        sizes = [width // parts] * parts
    return b.call(aten.split_with_sizes.default, x, [int(s) for s in sizes], axis)


@_emits("Slice")
def _slice(b: FxBuilder, args: list[Any], attrs: dict[str, Any], n: int) -> Any:
    x = b.tensor(args[0])
    starts, ends = _ints(b, args[1]), _ints(b, args[2])
    axes = _ints(b, _arg(args, 3)) if _arg(args, 3) is not None else list(range(len(starts or [])))
    steps = _ints(b, _arg(args, 4)) if _arg(args, 4) is not None else [1] * len(starts or [])
    if starts is None or ends is None or axes is None or steps is None:
        raise RewriteDeclined("Slice bounds are not constant")
    for start, end, axis, step in zip(starts, ends, axes, steps):
        if step <= 0:
            raise RewriteDeclined("aten.slice steps forward only")
        x = b.call(aten.slice.Tensor, x, int(axis), start, end, step)
    return x


@_emits("Unsqueeze")
def _unsqueeze(b: FxBuilder, args: list[Any], attrs: dict[str, Any], n: int) -> Any:
    x = b.tensor(args[0])
    axes = _ints(b, _arg(args, 1)) if _arg(args, 1) is not None else attrs.get("axes")
    if axes is None:
        raise RewriteDeclined("Unsqueeze axes are not constant")
    rank = b.rank(x) + len(axes)
    for axis in sorted(int(a) % rank for a in axes):
        x = b.call(aten.unsqueeze.default, x, axis)
    return x


@_emits("Squeeze")
def _squeeze(b: FxBuilder, args: list[Any], attrs: dict[str, Any], n: int) -> Any:
    x = b.tensor(args[0])
    axes = _ints(b, _arg(args, 1)) if _arg(args, 1) is not None else None
    if axes is None:
        axes = [i for i, d in enumerate(b.shape(x)) if isinstance(d, int) and d == 1]
    return b.call(aten.squeeze.dims, x, [int(a) for a in axes])


@_emits("Expand")
def _expand(b: FxBuilder, args: list[Any], attrs: dict[str, Any], n: int) -> Any:
    x, shape = b.tensor(args[0]), _ints(b, args[1])
    if shape is None:
        raise RewriteDeclined("the Expand shape is computed at run time")
    src = list(b.shape(x))
    rank = max(len(src), len(shape))
    src = [1] * (rank - len(src)) + src
    shape = [1] * (rank - len(shape)) + list(shape)
    # ONNX Expand broadcasts both ways: a 1 in the shape keeps the input's dim (-1 for aten).
    target = [-1 if (isinstance(s, int) and s == 1) else s for s in shape]
    return b.call(aten.expand.default, x, target)


@_emits("Pad")
def _pad(b: FxBuilder, args: list[Any], attrs: dict[str, Any], n: int) -> Any:
    x = b.tensor(args[0])
    pads, value = _ints(b, args[1]), _number(_arg(args, 2)) if _arg(args, 2) is not None else 0.0
    if attrs.get("mode", "constant") not in ("constant", b"constant") or pads is None or value is None or _arg(args, 3) is not None:
        raise RewriteDeclined("aten.constant_pad_nd takes a constant Pad with constant pads on every axis")
    rank = b.rank(x)
    torch_pads: list[int] = []
    for axis in reversed(range(rank)):
        torch_pads += [int(pads[axis]), int(pads[axis + rank])]
    return b.call(aten.constant_pad_nd.default, x, torch_pads, value)


@_emits("LayerNormalization")
def _layer_norm(b: FxBuilder, args: list[Any], attrs: dict[str, Any], n: int) -> Any:
    x = b.tensor(args[0])
    rank = b.rank(x)
    axis = int(attrs.get("axis", -1)) % rank
    normalized = [b.size(x, i) for i in range(axis, rank)]
    weight = b.tensor(_arg(args, 1), like=x) if _arg(args, 1) is not None else None
    bias = b.tensor(_arg(args, 2), like=x) if _arg(args, 2) is not None else None
    return b.call(aten.native_layer_norm.default, x, normalized, weight, bias, float(attrs.get("epsilon", 1e-5)))


@_emits("RMSNormalization")
def _rms_norm(b: FxBuilder, args: list[Any], attrs: dict[str, Any], n: int) -> Any:
    x = b.tensor(args[0])
    rank = b.rank(x)
    axis = int(attrs.get("axis", -1)) % rank
    normalized = [b.size(x, i) for i in range(axis, rank)]
    return b.call(aten.rms_norm.default, x, normalized, b.tensor(args[1], like=x), float(attrs.get("epsilon", 1e-5)))


@_emits("BatchNormalization")
def _batch_norm(b: FxBuilder, args: list[Any], attrs: dict[str, Any], n: int) -> Any:
    if int(attrs.get("training_mode", 0)):
        raise RewriteDeclined("training BatchNormalization has no inference kernel")
    x = b.tensor(args[0])
    params = [b.tensor(a, like=x) for a in args[1:5]]
    return b.call(aten._native_batch_norm_legit_no_training.default, x, *params, float(attrs.get("momentum", 0.9)), float(attrs.get("epsilon", 1e-5)))


# --------------------------------------------------------------------------- custom ops


@functools.lru_cache(maxsize=1)
def ensure_kernels() -> str | None:
    """Import graphopt.kernels (it registers torch.ops.graphopt.*); None, or why it could not."""
    try:
        import graphopt.kernels  # noqa: F401
    except Exception as error:  # a broken kernels package must not break compiling
        return f"graphopt.kernels failed to import: {type(error).__name__}: {error}"
    return None


def _custom_op(qualname: str) -> Any:
    namespace, name = qualname.split("::")
    try:
        return getattr(getattr(torch.ops, namespace), name).default
    except (AttributeError, RuntimeError):
        return None


def custom_op_problem(qualname: str, training: bool = False) -> str | None:
    """None if torch.ops.<qualname> is registered (and, for training, differentiable)."""
    ensure_kernels()
    op = _custom_op(qualname)
    if op is None:
        return f"torch.ops.{qualname.replace('::', '.')} is not registered"
    if training and not _has_gradient(qualname, op):
        return f"torch.ops.{qualname.replace('::', '.')} has no gradient formula"
    return None


def _has_gradient(qualname: str, op: Any) -> bool:
    from torch._library.custom_ops import OPDEFS

    opdef = OPDEFS.get(qualname)
    if opdef is not None:  # torch.library.custom_op / triton_op: a backward is registered or not
        return getattr(opdef, "_backward_fn", None) is not None
    name = op.name()
    return any(torch._C._dispatch_has_kernel_for_dispatch_key(name, key) for key in ("Autograd", "CompositeImplicitAutograd"))


def _graphopt(name: str) -> Any:
    op = _custom_op(f"graphopt::{name}")
    if op is None:
        raise RewriteDeclined(f"torch.ops.graphopt.{name} is not registered")
    return op


# --------------------------------------------------------------------------- graphopt ops -> torch

#: fn(builder, inputs, attrs, wanted output indices) -> the outputs (only the wanted ones need be built).
LoweringFn = Callable[[FxBuilder, list[Any], dict[str, Any], set[int]], list[Any]]


@dataclass(frozen=True)
class GraphoptLowering:
    op_type: str
    fn: LoweringFn
    #: The custom ops it calls ("graphopt::attention"); empty when it lowers to ATen only.
    custom_ops: tuple[str, ...] = ()
    dtypes: frozenset[str] = _FLOATS
    #: Why the ATen ops it emits have no derivative (None: they have one); such a lowering is
    #: left out where gradients flow.
    no_gradient: str | None = None

    def problem(self, training: bool) -> str | None:
        if training and self.no_gradient:
            return self.no_gradient
        for qualname in self.custom_ops:
            reason = custom_op_problem(qualname, training)
            if reason is not None:
                return reason
        return None


#: graphopt op -> its torch lowering: the registry's table (graphopt.ops.registry), filled by `_lowers`.
GRAPHOPT: Mapping[str, GraphoptLowering] = registry.torch_lowerings()


def _lowers(op_type: str, custom_ops: tuple[str, ...] = (), dtypes: frozenset[str] = _FLOATS,
            no_gradient: str | None = None) -> Callable[[LoweringFn], LoweringFn]:
    def register(fn: LoweringFn) -> LoweringFn:
        registry.register_torch_lowering(op_type, GraphoptLowering(op_type, fn, custom_ops, dtypes, no_gradient))
        return fn

    return register


def _scale(attrs: dict[str, Any]) -> float | None:
    scale = attrs.get("scale")
    return None if scale is None else float(scale)


@_lowers("ScaledDotProductAttention", ("graphopt::attention",))
def _sdpa(b: FxBuilder, args: list[Any], attrs: dict[str, Any], wanted: set[int]) -> list[Any]:
    q, k, v, mask = (b.tensor(a) if a is not None else None for a in (*args, None, None, None)[:4])
    return [b.call(_graphopt("attention"), q, k, v, mask, bool(int(attrs.get("is_causal", 0))), _scale(attrs))]


@_lowers("MultiHeadAttention", ("graphopt::attention",))
def _mha(b: FxBuilder, args: list[Any], attrs: dict[str, Any], wanted: set[int]) -> list[Any]:
    """q, k, v [batch, seq, heads * head] -> [batch, heads, seq, head] views, attention, and back."""
    q, k, v, bias = (b.tensor(a) if a is not None else None for a in (*args, None, None, None)[:4])
    heads = int(attrs["num_heads"])

    def split_heads(x: Any) -> Any:
        hidden = b.size(x, 2)
        if not isinstance(hidden, int) or hidden % heads:
            raise RewriteDeclined(f"hidden size {hidden} does not split into {heads} heads")
        x4 = b.call(aten.reshape.default, x, [b.size(x, 0), b.size(x, 1), heads, hidden // heads])
        return b.call(aten.permute.default, x4, [0, 2, 1, 3])

    if bias is not None and b.meta(bias).dtype == torch.bool:
        raise RewriteDeclined("graphopt.MultiHeadAttention takes an additive bias")
    out = b.call(_graphopt("attention"), split_heads(q), split_heads(k), split_heads(v), bias, False, _scale(attrs))
    merged = b.call(aten.permute.default, out, [0, 2, 1, 3])
    return [b.call(aten.reshape.default, merged, [b.size(q, 0), b.size(q, 1), b.size(v, 2)])]


def _norm_stats(b: FxBuilder, total: Any, rms: bool) -> tuple[Any, Any]:
    """Mean and 1/std over the last axis with the kept dim ([batch, seq, 1]), as the ONNX ops return them (f32 math)."""
    x = b.call(prims.convert_element_type.default, total, torch.float32)
    mean = b.call(aten.mean.dim, x, [-1], True)
    centred = x if rms else b.call(aten.sub.Tensor, x, mean)
    var = b.call(aten.mean.dim, b.call(aten.mul.Tensor, centred, centred), [-1], True)
    return mean, var


@_lowers("SkipLayerNorm", ("graphopt::layer_norm",))
def _skip_layer_norm(b: FxBuilder, args: list[Any], attrs: dict[str, Any], wanted: set[int]) -> list[Any]:
    """(out, mean, inv_std, sum) of LayerNorm(a + skip (+ bias)); graphopt::layer_norm returns out and the sum."""
    a, skip, gamma, beta, bias = (b.tensor(x) if x is not None else None for x in (*args, None, None, None)[:5])
    if bias is not None:
        a = b.call(aten.add.Tensor, a, bias)
    eps = float(attrs.get("epsilon", 1e-5))
    both = b.call(_graphopt("layer_norm"), a, skip, gamma, beta, eps)
    out, total = b.item(both, 0), b.item(both, 1)
    outputs: list[Any] = [out, None, None, total]
    if wanted & {1, 2}:
        mean, var = _norm_stats(b, total, rms=False)
        outputs[1] = mean
        outputs[2] = b.call(aten.rsqrt.default, b.call(aten.add.Tensor, var, eps))
    return outputs


@_lowers("RMSNorm", ("graphopt::rms_norm",))
def _rms_norm_op(b: FxBuilder, args: list[Any], attrs: dict[str, Any], wanted: set[int]) -> list[Any]:
    x, weight = b.tensor(args[0]), b.tensor(args[1])
    axis = int(attrs.get("axis", -1))
    if axis not in (-1, b.rank(x) - 1):
        raise RewriteDeclined(f"graphopt::rms_norm normalizes the last axis, not {axis}")
    both = b.call(_graphopt("rms_norm"), x, None, weight, float(attrs.get("epsilon", 1e-5)))
    return [b.item(both, 0)]


@_lowers("SkipRMSNorm", ("graphopt::rms_norm",))
def _skip_rms_norm(b: FxBuilder, args: list[Any], attrs: dict[str, Any], wanted: set[int]) -> list[Any]:
    a, skip, gamma = (b.tensor(x) for x in args[:3])
    eps = float(attrs.get("epsilon", 1e-5))
    both = b.call(_graphopt("rms_norm"), a, skip, gamma, eps)
    out, total = b.item(both, 0), b.item(both, 1)
    outputs: list[Any] = [out, None, None, total]
    if wanted & {1, 2}:
        mean, var = _norm_stats(b, total, rms=True)
        outputs[1] = mean
        outputs[2] = b.call(aten.rsqrt.default, b.call(aten.add.Tensor, var, eps))
    return outputs


@_lowers("Gelu", dtypes=_FLOATS | {"f64"})
def _gelu_op(b: FxBuilder, args: list[Any], attrs: dict[str, Any], wanted: set[int]) -> list[Any]:
    return [b.call(aten.gelu.default, b.tensor(args[0]))]


@_lowers("BiasGelu", dtypes=_FLOATS | {"f64"})
def _bias_gelu(b: FxBuilder, args: list[Any], attrs: dict[str, Any], wanted: set[int]) -> list[Any]:
    return [b.call(aten.gelu.default, b.call(aten.add.Tensor, b.tensor(args[0]), b.tensor(args[1])))]


@_lowers("FastGelu", dtypes=_FLOATS | {"f64"})
def _fast_gelu(b: FxBuilder, args: list[Any], attrs: dict[str, Any], wanted: set[int]) -> list[Any]:
    x = b.tensor(args[0])
    if _arg(args, 1) is not None:
        x = b.call(aten.add.Tensor, x, b.tensor(args[1]))
    return [b.call(aten.gelu.default, x, approximate="tanh")]


@_lowers("QuickGelu", dtypes=_FLOATS | {"f64"})
def _quick_gelu(b: FxBuilder, args: list[Any], attrs: dict[str, Any], wanted: set[int]) -> list[Any]:
    return [_swish(b, [args[0]], {"alpha": float(attrs.get("alpha", 1.702))}, 1)]


@_lowers("SwiGLU", ("graphopt::swiglu",))
def _swiglu(b: FxBuilder, args: list[Any], attrs: dict[str, Any], wanted: set[int]) -> list[Any]:
    return [b.call(_graphopt("swiglu"), b.tensor(args[0]), b.tensor(args[1]))]


@_lowers("GeGLU", ("graphopt::geglu",))
def _geglu(b: FxBuilder, args: list[Any], attrs: dict[str, Any], wanted: set[int]) -> list[Any]:
    """graphopt.GeGLU(x, bias): (x + bias) halved on the last axis into (a, g) -> a * gelu(g)."""
    x = b.call(aten.add.Tensor, b.tensor(args[0]), b.tensor(args[1]))
    width = b.size(x, -1)
    if not isinstance(width, int) or width % 2:
        raise RewriteDeclined(f"the last dim {width} does not halve")
    half = width // 2
    up = b.call(aten.slice.Tensor, x, -1, 0, half)
    gate = b.call(aten.slice.Tensor, x, -1, half, width)
    return [b.call(_graphopt("geglu"), gate, up, False)]


@_lowers("RotaryEmbedding", ("graphopt::rotary",))
def _rotary(b: FxBuilder, args: list[Any], attrs: dict[str, Any], wanted: set[int]) -> list[Any]:
    """graphopt.RotaryEmbedding(x, position_ids or offset, cos_cache, sin_cache), caches
    [positions, rotary / 2] as onnxruntime takes them -> graphopt::rotary on the HF form
    cos, sin [batch or 1, seq, rotary] (the half-width rows picked, then repeated)."""
    x, positions, cos_cache, sin_cache = (b.tensor(a) for a in args[:4])
    interleaved = bool(int(attrs.get("interleaved", 0)))
    if b.rank(x) not in (3, 4) or attrs.get("num_heads") or attrs.get("rotary_embedding_dim"):
        raise RewriteDeclined("graphopt::rotary takes x [batch, heads, seq, head] or [batch, seq, hidden] with the whole rotary dim in the caches")
    hidden_form = b.rank(x) == 3
    if hidden_form:  # [batch, seq, heads * head] as onnxruntime takes it: heads of the caches' width, moved to [batch, heads, seq, head]
        head, hidden = 2 * b.size(cos_cache, -1), b.size(x, 2)
        if not isinstance(head, int) or not isinstance(hidden, int) or hidden % head:
            raise RewriteDeclined(f"hidden size {hidden} is no multiple of the rotary head size {head}")
        batch, length = b.size(x, 0), b.size(x, 1)
        x = b.call(aten.permute.default, b.call(aten.reshape.default, x, [batch, length, hidden // head, head]), [0, 2, 1, 3])
    seq = b.size(x, 2)
    single = b.meta(positions).numel() == 1

    def hf_form(cache: Any) -> Any:
        if single:  # positions offset, offset + 1, ... (the offset is a constant; 0 while only shapes are asked)
            offsets = b.const_array(positions)
            offset = int(offsets.reshape(-1)[0]) if offsets is not None else 0
            if offset and not isinstance(seq, int):
                raise RewriteDeclined("a rotary offset with a symbolic sequence length")
            rows = b.call(aten.unsqueeze.default, b.call(aten.slice.Tensor, cache, 0, offset, offset + seq if offset else seq), 0)
        else:  # position ids [batch, seq]
            rows = b.call(aten.embedding.default, cache, positions)
        if interleaved:
            return b.call(aten.repeat_interleave.self_int, rows, 2, -1)
        return b.call(aten.cat.default, [rows, rows], -1)

    out = b.call(_graphopt("rotary"), x, hf_form(cos_cache), hf_form(sin_cache), interleaved)
    if hidden_form:
        out = b.call(aten.reshape.default, b.call(aten.permute.default, out, [0, 2, 1, 3]), [batch, length, hidden])
    return [out]


@_lowers("GemmActivation", dtypes=_FLOATS | {"f64"}, no_gradient="aten._addmm_activation has no derivative formula")
def _gemm_activation(b: FxBuilder, args: list[Any], attrs: dict[str, Any], wanted: set[int]) -> list[Any]:
    """graphopt.GemmActivation(a, b, bias) {activation = Relu | GeluTanh} -> aten._addmm_activation
    (cuBLASLt's bias + activation epilogue on CUDA; addmm then ReLU in place on the CPU)."""
    activation = attrs.get("activation")
    activation = activation.decode() if isinstance(activation, bytes) else activation
    if activation not in ("Relu", "GeluTanh"):
        raise RewriteDeclined(f"aten._addmm_activation applies Relu or GeluTanh, not {activation}")
    a, m, c = (b.tensor(x) for x in args[:3])
    if activation == "GeluTanh" and b.meta(a).device.type != "cuda":
        # The CPU kernel of aten._addmm_activation applies the erf GELU (CUDA's, the tanh one).
        raise RewriteDeclined("aten._addmm_activation applies the tanh GELU on CUDA tensors only")
    return [b.call(aten._addmm_activation.default, c, a, m, use_gelu=activation == "GeluTanh")]


@_lowers("FusedConv", ("graphopt::conv_relu",))
def _fused_conv(b: FxBuilder, args: list[Any], attrs: dict[str, Any], wanted: set[int]) -> list[Any]:
    """graphopt.FusedConv(x, w, b, z) {activation = "Relu"}, 2-D -> graphopt::conv_relu (cuDNN's fused
    conv-bias-(add-)ReLU on CUDA). Other activations have no fused torch kernel and stay unfused."""
    if attrs.get("activation") not in ("Relu", b"Relu"):
        raise RewriteDeclined(f"graphopt::conv_relu fuses ReLU only, not {attrs.get('activation')}")
    x, w = b.tensor(args[0]), b.tensor(args[1])
    if b.meta(x).device.type != "cuda":  # elsewhere there is no fused kernel to gain: the conv stays as it is
        raise RewriteDeclined("graphopt::conv_relu runs cuDNN's fused kernel, on CUDA tensors only")
    if b.rank(w) != 4:
        raise RewriteDeclined("graphopt::conv_relu takes 2-D convolutions")
    if attrs.get("auto_pad", "NOTSET") not in ("NOTSET", b"NOTSET"):
        raise RewriteDeclined("graphopt::conv_relu takes explicit pads only")
    pads = [int(p) for p in attrs.get("pads", [0] * 4)]
    if pads[:2] != pads[2:]:
        raise RewriteDeclined(f"graphopt::conv_relu pads both sides equally, not {pads}")
    bias = b.tensor(_arg(args, 2), like=x) if _arg(args, 2) is not None else None
    z = b.tensor(_arg(args, 3), like=x) if _arg(args, 3) is not None else None
    strides = [int(v) for v in attrs.get("strides", [1, 1])]
    dilations = [int(v) for v in attrs.get("dilations", [1, 1])]
    return [b.call(_graphopt("conv_relu"), x, w, bias, z, strides, pads[:2], dilations, int(attrs.get("group", 1)))]


def neutral_node(b: FxBuilder, op_type: str, args: list[Any], attrs: dict[str, Any], num_outputs: int) -> fx.Node:
    """A graphopt op as one FX node that rules can match; lowered by `lower_neutral_nodes`."""
    lowering = GRAPHOPT.get(op_type)
    if lowering is None:
        raise RewriteDeclined(f"target torch has no lowering for graphopt.{op_type}")
    attrs = registry.with_defaults(op_type, attrs)  # the declared defaults, as on every other target
    inputs = [b.tensor(a) if isinstance(a, InlineConst) else a for a in args]
    evaluating = FxBuilder(None, b.fake_mode, evaluate=True)
    fake_inputs = [b.meta(x) if x is not None else None for x in inputs]
    try:
        outs = lowering.fn(evaluating, fake_inputs, attrs, set(range(num_outputs)))
    except RewriteDeclined:
        raise
    except Exception as error:  # the custom op's shape checks refuse these inputs
        raise RewriteDeclined(f"graphopt.{op_type} does not take these inputs: {_first_line(error)}") from None
    outs = outs[:num_outputs]
    if any(o is None for o in outs):
        raise RewriteDeclined(f"graphopt.{op_type} cannot produce all of its {num_outputs} outputs on torch")
    assert b.graph is not None
    node = b.graph.call_function(neutral_op(op_type), tuple(inputs), {})
    node.meta["val"] = tuple(outs) if num_outputs > 1 else outs[0]
    node.meta["graphopt_attrs"] = dict(attrs)
    b.created.append(node)
    return node


def lower_neutral_nodes(
    gm: fx.GraphModule,
    fake_mode: Any,
    constant: Callable[[torch.Tensor, str], Any],
    const_array: Callable[[Any], Any] | None = None,
    device: torch.device | str = "cpu",
) -> int:
    """Replace every neutral graphopt node by the torch ops it runs on; returns how many."""
    graph = gm.graph
    lowered = 0
    for node in list(graph.nodes):
        if not is_neutral(node):
            continue
        op_type = node.target.op_type  # type: ignore[union-attr]
        multi = isinstance(node.meta.get("val"), tuple)
        projections = [u for u in node.users if u.target is operator.getitem] if multi else []
        wanted = {int(u.args[1]) for u in projections} if multi else {0}  # type: ignore[arg-type]
        with graph.inserting_before(node):
            b = FxBuilder(graph, fake_mode, constant=constant, const_array=const_array, device=device)
            outs = GRAPHOPT[op_type].fn(b, list(node.args), dict(node.meta.get("graphopt_attrs", {})), wanted)
        if multi:
            for user in projections:
                user.replace_all_uses_with(outs[int(user.args[1])])  # type: ignore[arg-type]
                graph.erase_node(user)
        else:
            node.replace_all_uses_with(outs[0])
        graph.erase_node(node)
        lowered += 1
    return lowered


# --------------------------------------------------------------------------- the target


#: graphopt ops whose custom kernels beat what inductor generates for the ops they replace,
#: measured on the GPU (the fact `torch_beats_inductor`, declared with the op in
#: graphopt/ops/fused_ops.py with its measurement): with inductor and kernels="auto" only
#: these are used, so that graphopt + inductor is never slower than inductor alone.
PREFERRED_OVER_INDUCTOR: frozenset[str] = registry.names_with("torch_beats_inductor", registry.GRAPHOPT_DOMAIN)


def torch_target(training: bool = False, kernels: str = "all") -> Target:
    """The capability table of the torch backend: every canonical op with an ATen form, and
    the graphopt ops whose custom ops are registered (and, for training, differentiable).

    `kernels`: "all" uses every registered custom op; "none" none of them (graphopt ops that
    lower to ATen only stay); "inductor" only those in PREFERRED_OVER_INDUCTOR."""
    if kernels not in ("all", "none", "inductor"):
        raise ValueError(f"kernels must be 'all', 'none' or 'inductor', not {kernels!r}")
    kernel_table: dict[tuple[str, str], frozenset[str]] = {("", op): _ALL_DTYPES for op in CANONICAL}
    lowerings: dict[str, Any] = {}
    for op_type, lowering in GRAPHOPT.items():
        if lowering.custom_ops and (kernels == "none" or (kernels == "inductor" and op_type not in PREFERRED_OVER_INDUCTOR)):
            continue
        if lowering.problem(training) is not None:
            continue
        torch_op = lowering.custom_ops[0] if lowering.custom_ops else f"aten::{op_type}"
        lowerings[op_type] = Lowering("torch", torch_op)
        kernel_table[("torch", torch_op)] = lowering.dtypes
    name = "torch" + ("-train" if training else "") + {"all": "", "none": "-aten", "inductor": "+inductor"}[kernels]
    description = "torch.compile backend: ATen ops" + ("" if kernels == "none" else " and torch.ops.graphopt custom ops")
    if kernels == "inductor":
        description += " where they beat inductor's own code"
    if training:
        description += ", where gradients flow"
    return Target(name, description, kernel_table, lowerings, complete=True)


def unavailable_graphopt_ops(training: bool = False) -> dict[str, str]:
    """graphopt op -> why the torch target has no lowering for it (for reports and docs)."""
    return {op: reason for op, lowering in GRAPHOPT.items() if (reason := lowering.problem(training)) is not None}


def _first_line(error: BaseException) -> str:
    text = str(error).strip().splitlines()
    return text[0] if text else type(error).__name__


