"""How much a constant fold would grow the model, known before the fold is computed.

Constant folding (graphopt.passes.constant_folding) lets one fold grow the model by at most
its size limit: growth = bytes of the new constants - bytes of the constant inputs that
die with the node. The outputs' size is bounded from the input data before anything is
evaluated (a model's declared shapes may lie), so a huge result is never computed; ops
whose output size the inputs cannot bound (the registry's fact `unbounded_output`) need a
static declared shape.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
import onnx_ir as ir

from graphopt.ops.registry import has_fact
from graphopt.passes.fold_numpy_paths import _attr, _norm


def _dead_input_bytes(node: ir.Node, xs: Sequence[np.ndarray | None]) -> int:
    """Bytes of constant inputs that only this node uses: they go when it folds."""
    total = 0
    seen: set[ir.Value] = set()
    for value, array in zip(node.inputs, xs, strict=False):
        if value is None or array is None or value in seen or array.dtype == object:
            continue
        seen.add(value)
        if value.is_graph_output() or value.is_graph_input():
            continue
        if all(use.node is node for use in value.uses()):
            total += array.nbytes
    return total


def _estimate_out_bytes(node: ir.Node, xs: Sequence[np.ndarray | None]) -> int | None:
    """An upper estimate of the outputs' size before computing them; None when unbounded.

    Computed from the input data where the op allows (a model's value_info may lie: a
    [1, 1] declared over a 100000 x 100000 ConstantOfShape would have been allocated);
    the declared output shapes only where the data cannot bound the op."""
    declared: int | None = 0
    for out in node.outputs:
        shape, dtype = out.shape, out.dtype
        known = [d for d in shape if isinstance(d, int)] if shape is not None else None
        if shape is None or known is None or dtype is None or len(known) != len(shape):
            declared = None
            break
        declared = (declared or 0) + math.prod(known) * max(int(dtype.itemsize), 1)
    computed = _computed_out_bytes(node, xs)
    if computed is not None:
        return max(computed, declared or 0)
    return None if not has_fact(node.domain, node.op_type, "unbounded_output") or declared is None else int(declared)


def _computed_out_bytes(node: ir.Node, xs: Sequence[np.ndarray | None]) -> int | None:
    """The outputs' size from the input data, or None when the data cannot bound them."""
    op = node.op_type
    if has_fact(node.domain, op, "unbounded_output"):
        return None
    arrays = [x for x in xs if x is not None]
    itemsize = max((x.itemsize for x in arrays if x.dtype != object), default=8)
    try:
        if op == "ConstantOfShape":
            value = node.attributes.get("value")
            itemsize = value.value.dtype.itemsize if value is not None else 4
            count = math.prod(int(d) for d in arrays[0])
        elif op == "Expand":
            count = math.prod(np.broadcast_shapes(arrays[0].shape, tuple(int(d) for d in arrays[1])))
        elif op == "CastLike":  # the second input only lends its type
            count, itemsize = arrays[0].size, arrays[1].itemsize
        elif op == "Tile":
            count = arrays[0].size * math.prod(int(r) for r in arrays[1])
        elif op == "Range":
            start, limit, delta = (float(x) for x in arrays[:3])
            count = max(math.ceil((limit - start) / delta), 0)
        elif op == "OneHot":
            count = arrays[0].size * int(arrays[1].reshape(-1)[0])
            itemsize = arrays[2].itemsize
        elif op == "Gather":
            data, indices = arrays[0], arrays[1]
            axis = _norm(_attr(node, "axis", 0), data.ndim)
            count = data.size // max(data.shape[axis], 1) * indices.size
        elif op in ("MatMul", "Gemm"):
            a, b = arrays[0], arrays[1]
            count = a.size // max(a.shape[-1], 1) * b.shape[-1] * max(b.size // max(b.shape[-2] * b.shape[-1], 1), 1)
        else:
            # Elementwise and broadcasting ops; ops that never grow are bounded by it too.
            try:
                count = math.prod(np.broadcast_shapes(*(x.shape for x in arrays)))
            except ValueError:
                count = 0
            count = max(count, max((x.size for x in arrays), default=0))
    except (ValueError, IndexError, ZeroDivisionError, OverflowError, TypeError):
        return None
    return int(count) * itemsize
