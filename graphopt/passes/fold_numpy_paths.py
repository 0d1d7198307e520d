"""numpy fast paths for constant folding: the small ops of shape arithmetic, computed directly.

Shape arithmetic (Shape, Gather, Concat, Slice, Unsqueeze, Reshape, Range, elementwise
integer math, ...) folds at every sweep; onnx.reference's op classes are slow to set up
for such tiny tensors, so these ops are computed with numpy here (checked against
onnxruntime in tests). Each fast path returns the outputs, or None to hand the node to
onnx.reference; `_NoFold` (or a numpy error) leaves the node as it is.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import onnx_ir as ir

# dtypes numpy handles natively; others (bfloat16, float8, int4, string) go to onnx.reference.
_NATIVE_DTYPES = frozenset(
    {
        ir.DataType.BOOL, ir.DataType.INT8, ir.DataType.INT16, ir.DataType.INT32, ir.DataType.INT64,
        ir.DataType.UINT8, ir.DataType.UINT16, ir.DataType.UINT32, ir.DataType.UINT64,
        ir.DataType.FLOAT16, ir.DataType.FLOAT, ir.DataType.DOUBLE,
    }
)  # fmt: skip


class _NoFold(Exception):
    """The node must stay as it is (e.g. integer division by zero)."""


_FastOp = Callable[[ir.Node, list[Any], int], "list[np.ndarray] | None"]


def _attr(node: ir.Node, name: str, default: Any) -> Any:
    attr = node.attributes.get(name)
    return default if attr is None else attr.value


def _norm(axis: int, rank: int) -> int:
    return int(axis) + rank if axis < 0 else int(axis)


def _clamp(x: int, lo: int, hi: int) -> int:
    return max(lo, min(hi, x))


def _contiguous(a: np.ndarray) -> np.ndarray:
    # Not np.ascontiguousarray: it turns 0-d arrays into 1-d ones.
    return a if a.flags.c_contiguous else a.copy(order="C")


def _native(*arrays: np.ndarray) -> bool:
    return all(a.dtype.kind in "biuf" and a.dtype.itemsize <= 8 and a.dtype.name != "bfloat16" for a in arrays)


def _binary(fn: Callable[[Any, Any], Any], kinds: str) -> _FastOp:
    def run(node: ir.Node, xs: list[Any], version: int) -> list[np.ndarray] | None:
        a, b = xs
        if a.dtype != b.dtype or a.dtype.kind not in kinds or not _native(a):
            return None
        return [np.asarray(fn(a, b))]

    return run


def _unary(fn: Callable[[Any], Any], kinds: str) -> _FastOp:
    def run(node: ir.Node, xs: list[Any], version: int) -> list[np.ndarray] | None:
        (a,) = xs
        if a.dtype.kind not in kinds or not _native(a):
            return None
        return [np.asarray(fn(a))]

    return run


def _div(node: ir.Node, xs: list[Any], version: int) -> list[np.ndarray] | None:
    a, b = xs
    if a.dtype != b.dtype or not _native(a):
        return None
    if a.dtype.kind == "f":
        return [np.asarray(np.divide(a, b))]
    if a.dtype.kind not in "iu":
        return None
    if np.any(b == 0):
        raise _NoFold  # undefined at runtime: leave it to the runtime
    # ONNX (and onnxruntime) integer division truncates toward zero; numpy's // floors.
    q = np.floor_divide(a, b)
    q = q + ((np.remainder(a, b) != 0) & ((a < 0) != (b < 0))).astype(a.dtype)
    return [np.asarray(q, dtype=a.dtype)]


def _where(node: ir.Node, xs: list[Any], version: int) -> list[np.ndarray] | None:
    c, x, y = xs
    if c.dtype != np.bool_ or x.dtype != y.dtype or not _native(x):
        return None
    return [np.asarray(np.where(c, x, y))]


def _cast(node: ir.Node, xs: list[Any], version: int) -> list[np.ndarray] | None:
    (x,) = xs
    to = ir.DataType(_attr(node, "to", 0))
    if to not in _NATIVE_DTYPES or not _native(x):
        return None
    target = to.numpy()
    if x.dtype.kind == "f" and target.kind in "iu" and x.size:
        info = np.iinfo(target)
        if not np.all(np.isfinite(x)) or x.min() < info.min or x.max() > info.max:
            raise _NoFold  # out-of-range float -> int is undefined behaviour
    return [np.asarray(x.astype(target))]


def _cast_like(node: ir.Node, xs: list[Any], version: int) -> list[np.ndarray] | None:
    x, like = xs
    if not (_native(x) and _native(like)):
        return None
    if x.dtype.kind == "f" and like.dtype.kind in "iu" and x.size:
        info = np.iinfo(like.dtype)
        if not np.all(np.isfinite(x)) or x.min() < info.min or x.max() > info.max:
            raise _NoFold  # out-of-range float -> int is undefined behaviour
    return [np.asarray(x.astype(like.dtype))]


def _gather(node: ir.Node, xs: list[Any], version: int) -> list[np.ndarray] | None:
    data, indices = xs
    if indices.dtype.kind not in "iu":
        return None
    axis = _norm(_attr(node, "axis", 0), data.ndim)
    return [np.asarray(np.take(data, indices, axis=axis))]


def _concat(node: ir.Node, xs: list[Any], version: int) -> list[np.ndarray] | None:
    arrays = [x for x in xs if x is not None]
    if len({a.dtype for a in arrays}) != 1:
        return None
    axis = _norm(_attr(node, "axis", 0), arrays[0].ndim)
    return [np.concatenate(arrays, axis=axis)]


def _axes_from(node: ir.Node, xs: list[Any]) -> list[int] | None:
    if len(xs) > 1 and xs[1] is not None:
        return [int(a) for a in xs[1].reshape(-1)]
    axes = _attr(node, "axes", None)
    return None if axes is None else [int(a) for a in axes]


def _unsqueeze(node: ir.Node, xs: list[Any], version: int) -> list[np.ndarray] | None:
    data = xs[0]
    axes = _axes_from(node, xs)
    if axes is None:
        return None
    rank = data.ndim + len(axes)
    out = data
    for axis in sorted(_norm(a, rank) for a in axes):
        out = np.expand_dims(out, axis)
    return [out]


def _squeeze(node: ir.Node, xs: list[Any], version: int) -> list[np.ndarray] | None:
    data = xs[0]
    axes = _axes_from(node, xs)
    if axes is None:
        return [np.squeeze(data)]
    return [np.squeeze(data, axis=tuple(_norm(a, data.ndim) for a in axes))]


def _slice(node: ir.Node, xs: list[Any], version: int) -> list[np.ndarray] | None:
    data = xs[0]
    if len(xs) >= 3:
        starts, ends = xs[1].reshape(-1), xs[2].reshape(-1)
        axes = xs[3].reshape(-1) if len(xs) > 3 and xs[3] is not None else range(len(starts))
        steps = xs[4].reshape(-1) if len(xs) > 4 and xs[4] is not None else [1] * len(starts)
    else:  # opset < 10: attributes
        starts, ends = _attr(node, "starts", None), _attr(node, "ends", None)
        if starts is None or ends is None:
            return None
        axes = _attr(node, "axes", range(len(starts)))
        steps = [1] * len(starts)
    index: list[slice] = [slice(None)] * data.ndim
    for start, end, axis, step in zip(starts, ends, axes, steps, strict=False):
        axis, start, end, step = _norm(int(axis), data.ndim), int(start), int(end), int(step)
        dim = data.shape[axis]
        if step == 0:
            raise _NoFold
        start = start + dim if start < 0 else start
        end = end + dim if end < 0 else end
        if dim == 0:
            index[axis] = slice(0, 0)
        elif step > 0:
            index[axis] = slice(_clamp(start, 0, dim), _clamp(end, 0, dim), step)
        else:
            end = _clamp(end, -1, dim - 1)
            index[axis] = slice(_clamp(start, 0, dim - 1), end if end >= 0 else None, step)
    return [_contiguous(data[tuple(index)])]


def _reshape(node: ir.Node, xs: list[Any], version: int) -> list[np.ndarray] | None:
    if len(xs) < 2 or xs[1] is None:
        return None  # opset 1 Reshape (shape attribute)
    data, shape = xs[0], [int(d) for d in xs[1].reshape(-1)]
    if not _attr(node, "allowzero", 0):
        shape = [data.shape[i] if d == 0 else d for i, d in enumerate(shape)]
    return [data.reshape(shape)]


def _transpose(node: ir.Node, xs: list[Any], version: int) -> list[np.ndarray] | None:
    data = xs[0]
    perm = _attr(node, "perm", None)
    perm = list(range(data.ndim))[::-1] if perm is None else [int(p) for p in perm]
    return [_contiguous(np.transpose(data, perm))]


def _range(node: ir.Node, xs: list[Any], version: int) -> list[np.ndarray] | None:
    start, limit, delta = xs
    if start.dtype.kind not in "iu" or not (start.dtype == limit.dtype == delta.dtype):
        return None  # float ranges: onnx.reference
    if int(delta) == 0:
        raise _NoFold
    return [np.arange(int(start), int(limit), int(delta), dtype=start.dtype)]


def _constant_of_shape(node: ir.Node, xs: list[Any], version: int) -> list[np.ndarray] | None:
    shape = [int(d) for d in xs[0].reshape(-1)]
    value = node.attributes.get("value")
    fill = value.value.numpy().reshape(-1) if value is not None else np.zeros(1, np.float32)
    if not _native(fill):
        return None
    return [np.full(shape, fill[0], dtype=fill.dtype)]


def _expand(node: ir.Node, xs: list[Any], version: int) -> list[np.ndarray] | None:
    data, shape = xs
    target = np.broadcast_shapes(data.shape, tuple(int(d) for d in shape.reshape(-1)))
    return [np.array(np.broadcast_to(data, target))]


def _tile(node: ir.Node, xs: list[Any], version: int) -> list[np.ndarray] | None:
    data, repeats = xs
    return [np.tile(data, [int(r) for r in repeats.reshape(-1)])]


def _shape(node: ir.Node, xs: list[Any], version: int) -> list[np.ndarray] | None:
    dims = xs[0].shape
    rank = len(dims)
    start = _clamp(_norm(int(_attr(node, "start", 0)), rank), 0, rank)
    end = _clamp(_norm(int(_attr(node, "end", rank)), rank), 0, rank)
    return [np.array(dims[start:end], dtype=np.int64)]


def _size(node: ir.Node, xs: list[Any], version: int) -> list[np.ndarray] | None:
    return [np.array(xs[0].size, dtype=np.int64)]


_FAST_OPS: dict[str, _FastOp] = {
    "Shape": _shape,  # of a constant; Shape of a computed value is the shape rules' job
    "Size": _size,
    "Add": _binary(np.add, "iuf"),
    "Sub": _binary(np.subtract, "iuf"),
    "Mul": _binary(np.multiply, "iuf"),
    "Div": _div,
    "Equal": _binary(np.equal, "biuf"),
    "Less": _binary(np.less, "iuf"),
    "Greater": _binary(np.greater, "iuf"),
    "LessOrEqual": _binary(np.less_equal, "iuf"),
    "GreaterOrEqual": _binary(np.greater_equal, "iuf"),
    "And": _binary(np.logical_and, "b"),
    "Or": _binary(np.logical_or, "b"),
    "Xor": _binary(np.logical_xor, "b"),
    "Not": _unary(np.logical_not, "b"),
    "Neg": _unary(np.negative, "if"),
    "Sqrt": _unary(np.sqrt, "f"),
    "Reciprocal": _unary(np.reciprocal, "f"),
    "Where": _where,
    "Cast": _cast,
    "CastLike": _cast_like,
    "Gather": _gather,
    "Concat": _concat,
    "Unsqueeze": _unsqueeze,
    "Squeeze": _squeeze,
    "Slice": _slice,
    "Reshape": _reshape,
    "Transpose": _transpose,
    "Range": _range,
    "ConstantOfShape": _constant_of_shape,
    "Expand": _expand,
    "Tile": _tile,
}
