"""Canonical ops -> ATen: each standard ONNX op a rule builds on an FX graph (Conv, Gemm,
Reshape, Cast, ...) becomes the ATen call(s) with that meaning, at once, when the rewrite is
planned. `CANONICAL` is the table; `emit_canonical` the entry point.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from graphopt.ir.dtypes import onnx_enum_to_name
from graphopt.ir.fx_values import InlineConst, torch_dtype_from_name
from graphopt.ops.fx_builder import FxBuilder, arg, ints, number
from graphopt.pattern.native import RewriteDeclined

__all__ = ["CANONICAL", "Emitter", "emit_canonical", "emit_swish"]

aten = torch.ops.aten
prims = torch.ops.prims

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


def _conv_common(b: FxBuilder, args: list[Any], attrs: dict[str, Any], transposed: bool) -> Any:
    x, w, bias = arg(args, 0), b.tensor(arg(args, 1)), arg(args, 2)
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
    a, m, c = b.tensor(args[0]), b.tensor(args[1]), arg(args, 2)
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
    x, shape = b.tensor(args[0]), ints(b, args[1])
    if shape is None:
        raise RewriteDeclined("the target shape is computed at run time")
    allowzero = int(attrs.get("allowzero", 0))
    dims = [b.size(x, i) if (not allowzero and isinstance(s, int) and s == 0) else s for i, s in enumerate(shape)]
    return b.call(aten.reshape.default, x, dims)


def _binary(target: Any, swapped: Any = None) -> Emitter:
    """Tensor op tensor, tensor op number, or number op tensor (commutative ops swap; others get a 0-d constant)."""

    def emit(b: FxBuilder, args: list[Any], attrs: dict[str, Any], n: int) -> Any:
        x, y = args[0], args[1]
        if isinstance(y, InlineConst) and number(y) is not None and not isinstance(x, InlineConst):
            return b.call(target, x, number(y))
        if isinstance(x, InlineConst) and not isinstance(y, InlineConst):
            if swapped is not None and number(x) is not None:
                return b.call(swapped, y, number(x))
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
    if number(e) is not None:
        return b.call(aten.pow.Tensor_Scalar, x, number(e))
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
def emit_swish(b: FxBuilder, args: list[Any], attrs: dict[str, Any], n: int) -> Any:
    x, alpha = b.tensor(args[0]), float(attrs.get("alpha", 1.0))
    if alpha == 1.0:
        return b.call(aten.silu.default, x)
    return b.call(aten.mul.Tensor, x, b.call(aten.sigmoid.default, b.call(aten.mul.Tensor, x, alpha)))


@_emits("LeakyRelu")
def _leaky_relu(b: FxBuilder, args: list[Any], attrs: dict[str, Any], n: int) -> Any:
    return b.call(aten.leaky_relu.default, b.tensor(args[0]), float(attrs.get("alpha", 0.01)))


@_emits("Clip")
def _clip(b: FxBuilder, args: list[Any], attrs: dict[str, Any], n: int) -> Any:
    lo, hi = number(arg(args, 1)), number(arg(args, 2))
    if (arg(args, 1) is not None and lo is None) or (arg(args, 2) is not None and hi is None):
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
    axes = ints(b, arg(args, 1)) if arg(args, 1) is not None else attrs.get("axes")
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
    sizes = ints(b, arg(args, 1)) if arg(args, 1) is not None else None
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
    starts, ends = ints(b, args[1]), ints(b, args[2])
    axes = ints(b, arg(args, 3)) if arg(args, 3) is not None else list(range(len(starts or [])))
    steps = ints(b, arg(args, 4)) if arg(args, 4) is not None else [1] * len(starts or [])
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
    axes = ints(b, arg(args, 1)) if arg(args, 1) is not None else attrs.get("axes")
    if axes is None:
        raise RewriteDeclined("Unsqueeze axes are not constant")
    rank = b.rank(x) + len(axes)
    for axis in sorted(int(a) % rank for a in axes):
        x = b.call(aten.unsqueeze.default, x, axis)
    return x


@_emits("Squeeze")
def _squeeze(b: FxBuilder, args: list[Any], attrs: dict[str, Any], n: int) -> Any:
    x = b.tensor(args[0])
    axes = ints(b, arg(args, 1)) if arg(args, 1) is not None else None
    if axes is None:
        axes = [i for i, d in enumerate(b.shape(x)) if isinstance(d, int) and d == 1]
    return b.call(aten.squeeze.dims, x, [int(a) for a in axes])


@_emits("Expand")
def _expand(b: FxBuilder, args: list[Any], attrs: dict[str, Any], n: int) -> Any:
    x, shape = b.tensor(args[0]), ints(b, args[1])
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
    pads, value = ints(b, args[1]), number(arg(args, 2)) if arg(args, 2) is not None else 0.0
    if attrs.get("mode", "constant") not in ("constant", b"constant") or pads is None or value is None or arg(args, 3) is not None:
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
    weight = b.tensor(arg(args, 1), like=x) if arg(args, 1) is not None else None
    bias = b.tensor(arg(args, 2), like=x) if arg(args, 2) is not None else None
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


